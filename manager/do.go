package manager

import (
	"context"
	"errors"
)

// Do takes the lock on resource (as Acquire), runs fn with a context that is
// cancelled when the lock is lost or reaches its max hold (or when ctx
// ends), releases the lock and returns fn's error. If the lock was lost
// meanwhile, the error also matches ErrLockLost. If fn panics, Do releases
// the lock and the panic goes on.
func (m *Manager) Do(ctx context.Context, resource string, fn func(ctx context.Context) error, opts ...AcquireOption) error {
	if err := m.usable(); err != nil {
		return err
	}
	if fn == nil {
		return invalid("fn", "nil")
	}
	l, err := m.Acquire(ctx, resource, opts...)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	lctx := l.Context()
	stop := context.AfterFunc(lctx, func() { cancel(context.Cause(lctx)) })
	// Release even if ctx has ended, but not for longer than the lock can
	// live; and release when fn panics too, before the panic goes on.
	release := func() error {
		stop()
		cancel(nil)
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), l.ttlNow())
		defer rcancel()
		return l.Release(rctx)
	}
	panicked := true
	defer func() {
		if panicked {
			_ = release()
		}
	}()
	ferr := fn(fctx)
	panicked = false
	rerr := release()
	if errors.Is(rerr, ErrLockLost) {
		return errors.Join(ferr, ErrLockLost)
	}
	if rerr != nil {
		return errors.Join(ferr, rerr)
	}
	return ferr
}
