package manager

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/shardlock/shardlock/internal/scripts"
)

// ErrForgotten is what a Lock answers after Forget: its manager no longer
// renews or releases it (another process took it over with Resume). It is
// also the cause of the Lock's Context.
var ErrForgotten = errors.New("shardlock: lock handed on (forgotten)")

// Resume takes over a held lock by its token, handed on by another process
// (a job accepted by one process and finished by another): it checks that
// resource's key holds token and returns a *Lock owned by this Manager,
// watched, renewed and released by it like one it acquired. The key's TTL
// is set anew from now (the acquire options' TTL, or the Manager's), and
// with fencing on the Lock's Fence is the lock's fencing token. The process
// that handed the lock on should Forget its Lock, so that one watchdog
// renews it.
//
// It returns ErrNotHeld when another token holds the key, ErrExpired when
// the key is gone, and an *InvalidArgumentError for a token that is not
// one or a bad resource, before any round trip. Batch locks cannot be
// resumed.
func (m *Manager) Resume(ctx context.Context, resource, token string, opts ...AcquireOption) (*Lock, error) {
	if err := m.usable(); err != nil {
		return nil, err
	}
	if ctx == nil {
		return nil, invalid("context", "nil")
	}
	ac, key, err := m.acquireConfig(resource, opts)
	if err != nil {
		return nil, err
	}
	info, err := ParseToken(token)
	if err != nil {
		return nil, invalid("token", "not a shardlock token")
	}
	m.resolveClass(&ac, resource)
	ttlMs := strconv.FormatInt(ac.ttl.Milliseconds(), 10)
	var (
		res    []int64
		sentAt time.Time
	)
	err = m.retryTransient(ctx, time.Time{}, func(ctx context.Context) error {
		sentAt = time.Now()
		var err error
		res, err = m.runScript(ctx, m.cmd, scripts.Resume, []string{key}, token, ttlMs, luaFlag(ac.fencing)).Int64Slice()
		if err == nil && len(res) != 2 {
			err = fmt.Errorf("unexpected reply %v", res)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("shardlock: resume %q: %w", resource, err)
	}
	switch res[0] {
	case scripts.Gone:
		return nil, ErrExpired
	case scripts.NotOurs:
		return nil, ErrNotHeld
	}
	l := m.newLock(resource, key, token, token, uint64(res[1]), info.AcquiredAt, sentAt, &ac)
	if !monoNow().Before(l.validUntil) {
		return nil, ErrExpired // the reply came after the TTL it set would have run out
	}
	if !m.sched.add(l) {
		return nil, ErrClosed
	}
	return l, nil
}

// Forget stops this Manager renewing and releasing the lock, without
// releasing it: another process has taken it over (Resume), or will. Done
// closes and Context is cancelled with ErrForgotten; Release, Extend and
// TTL then return ErrForgotten without a round trip, and Close leaves the
// lock alone. It returns ErrForgotten for a lock already forgotten, and the
// lock's error (matching ErrLockLost) or ErrReleased for one no longer
// held.
func (l *Lock) Forget() error {
	if l.zero() {
		return ErrNilLock
	}
	l.mu.Lock()
	if l.state != stateHeld {
		err := l.heldErrLocked()
		l.mu.Unlock()
		return err
	}
	l.state, l.err = stateLost, ErrForgotten
	watched := l.watched
	l.endLocked(ErrForgotten, true)
	l.mu.Unlock()
	if watched {
		l.m.sched.remove(l)
	}
	l.m.queues.holderGone(l)
	return nil
}
