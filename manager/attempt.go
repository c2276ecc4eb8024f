package manager

import (
	"context"
	"time"

	"github.com/shardlock/shardlock/internal/transport"
)

// One acquire attempt, of every kind of lock: a single lock's (SET NX, the
// fenced script, or under WithReplicaAck a pipeline with WAIT:
// attempt_single.go), a fair waiter's (acquire_queue.lua:
// attempt_queued.go), a batch's (acquire_batch.lua: attempt_batch.go) and a
// read-write lock's (rw_acquire.lua: attempt_rw.go). The acquirer
// (acquire.go) and the primitives build on these; nothing here calls up
// into them.

// sendAttempt makes one acquire attempt, bounded by ctx and deadline (see
// bounded). An attempt whose caller stopped waiting is settled when its
// reply comes: a token that may hold the keys goes to the reaper at once.
func (m *Manager) sendAttempt(ctx context.Context, deadline time.Time, a attemptArgs) (attemptResult, error) {
	if err := ctx.Err(); err != nil {
		return attemptResult{}, err
	}
	bounds := m.tr.CmdBounds()
	if m.cfg.replicas > 0 {
		bounds = m.tr.ClientBounds() // the write and its WAIT go through the client
	}
	if cctx, cancel := transport.OnCaller(ctx, deadline, bounds); cctx != nil {
		defer cancel()
		return m.attemptSettled(cctx, &a)
	}
	b := a // captured by the exchange's goroutine; a stays on the stack
	return transport.ExchangeOn(m.tr, bounds, ctx, deadline, func(ctx context.Context) (attemptResult, error) {
		return m.attemptSettled(ctx, &b)
	}, func(res attemptResult, err error) {
		// The caller has gone: whatever the attempt may hold is released,
		// unless Redis said the key is someone else's or attemptSettled
		// already handed it over.
		if (err == nil && res.status != attemptContended) || (err != nil && !transport.IsAbandoned(err)) {
			m.orphan(b.tg, b.token, b.sendAt.Add(b.ac.ttl))
		}
	})
}

// attemptSettled is attemptOnce that hands the token to the reaper when the
// attempt was sent but its reply did not come in time (the coalescer's
// abandoned call): the server may still run it and take the key.
func (m *Manager) attemptSettled(ctx context.Context, a *attemptArgs) (attemptResult, error) {
	res, err := m.attemptOnce(ctx, a)
	if transport.IsAbandoned(err) {
		m.orphan(a.tg, a.token, a.sendAt.Add(a.ac.ttl))
	}
	return res, err
}

// attemptOnce makes the attempt a describes.
func (m *Manager) attemptOnce(ctx context.Context, a *attemptArgs) (attemptResult, error) {
	return a.tg.kind.attempt(m, ctx, *a)
}
