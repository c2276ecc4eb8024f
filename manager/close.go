package manager

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Close stops the watchdog, releases every lock this Manager still holds
// and every key an attempt whose caller stopped waiting may have taken
// (best effort, bounded by ctx; the locks' Done channels close), and waits
// for the Manager's goroutines. Commands already on their way to Redis get
// their replies first, for a second at most, so that such an attempt is
// released after it has run. With ctx already ended it still makes one try,
// bounded by a second. It returns an error that says how many locks it
// could not release, and how many exchanges with Redis were still without
// a reply when ctx ended (they end by the client's own timeouts). Calls
// made after Close return ErrClosed; a second Close returns ErrClosed.
func (m *Manager) Close(ctx context.Context) error {
	if err := m.usable(); err != nil {
		return err
	}
	if ctx == nil {
		return invalid("context", "nil")
	}
	err := ErrClosed
	m.closeOnce.Do(func() {
		m.closed.Store(true)
		close(m.closing)
		m.sched.stop()
		m.unregister()
		if ctx.Err() != nil {
			// Try once even so, bounded: the keys would otherwise stay
			// until their TTL.
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), closeGrace)
			defer cancel()
		}
		// Renewals, releases and coalesced batches in flight end first,
		// for a moment at most: their tokens may come back as orphans,
		// and an orphan's release must come after the attempt that may
		// have taken its key, or that attempt takes the key for its TTL.
		wctx, wcancel := context.WithTimeout(ctx, closeGrace)
		m.tr.Settle(wctx)
		wcancel()
		locks, orphans := m.sched.take()
		err = m.releaseAll(ctx, locks, orphans)
		if m.notify != nil {
			m.notify.close()
		}
		if n := m.tr.Close(ctx); n > 0 {
			err = errors.Join(err, fmt.Errorf("shardlock: close: %d exchanges with Redis still without a reply; they end by the client's timeouts", n))
		}
		m.bg.Wait()
	})
	return err
}

// closeGrace bounds Close's wait for exchanges in flight, and its one try
// at releasing when its context has already ended.
const closeGrace = time.Second
