package manager

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/redis/go-redis/v9"
	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
)

// How a release works.
//
// Lock.Release runs release.lua (release_batch.lua for a batch lock,
// rw_release.lua for a read-write lock): a compare-and-delete that, when
// waiters are queued (the key carries the queued mark), hands the key to
// the first live one instead, or to this process's next local waiter
// (queue.go). Transient errors are retried while the lock is valid; a
// release that could not be confirmed goes on in the background (the
// reaper) until the lock's TTL would end. Close and MultiLock release many
// locks at once with releaseLocks, one pipeline per node. Both build each
// lock's call with releaseCall and read its reply with releaseOutcome: one
// release path, sent one call at a time or many in a pipeline.

// releaseAll releases what Close found held: locks and orphaned tokens.
// It tries until ctx ends or the last of them would have expired anyway:
// an orphan whose time is up is not sent at all.
func (m *Manager) releaseAll(ctx context.Context, locks []*Lock, orphans []orphan) error {
	now := time.Now()
	var until time.Time
	live := orphans[:0]
	for _, o := range orphans {
		if o.deadline.After(now) {
			live = append(live, o)
			until = later(until, o.deadline)
		}
	}
	for _, l := range locks {
		until = later(until, l.validUntilNow())
	}
	if len(locks) == 0 && len(live) == 0 {
		return nil
	}
	if failed, err := m.releaseLocks(ctx, locks, live, until); failed > 0 {
		return fmt.Errorf("shardlock: close: %d locks not released: %w", failed, err)
	}
	return nil
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// releaseLocks releases locks (single or batch) and orphaned tokens with one
// pipeline per node, retrying transient failures until ctx ends or deadline
// (zero: none). Each lock's outcome is recorded on it, as its Release
// would; locks already released or lost are left alone. It returns how
// many locks and tokens it could not release and the error that stopped it;
// their tokens go to the orphan reaper.
func (m *Manager) releaseLocks(ctx context.Context, locks []*Lock, orphans []orphan, deadline time.Time) (failed int, err error) {
	items := make([]releaseItem, 0, len(locks)+len(orphans))
	for _, l := range locks {
		if l.beginRelease() {
			items = append(items, releaseItem{lock: l})
		}
	}
	for _, o := range orphans {
		items = append(items, releaseItem{orphan: o})
	}
	err = m.tr.RetryTransient(ctx, deadline, func(ctx context.Context) error {
		calls := make([]transport.ScriptCall, len(items))
		sentAt := time.Now()
		for i := range items {
			calls[i] = items[i].call()
		}
		if err := m.tr.Bounded(ctx, time.Time{}, func(ctx context.Context) error {
			transport.RunBatch(ctx, m.client, calls)
			return nil
		}, nil); err != nil {
			// No reply in time (calls belongs to the exchange now): all
			// are left, their outcomes unknown.
			for i := range items {
				items[i].ambiguous = true
			}
			return err
		}
		var (
			rest     []releaseItem
			firstErr error
		)
		for i, c := range calls {
			it := items[i]
			if err := c.Cmd.Err(); err != nil && (transport.IsTransient(err) || !transport.IsReply(err) && !errors.Is(err, redis.Nil)) {
				// Not settled: tried again while the errors are
				// transient, else counted as not released.
				it.ambiguous = it.ambiguous || transport.IsAmbiguous(err)
				rest = append(rest, it)
				if firstErr == nil || !transport.IsTransient(firstErr) {
					firstErr = err
				}
				continue
			}
			it.settle(c.Cmd, sentAt)
		}
		items = rest
		return firstErr
	})
	for _, it := range items {
		failed++
		if l := it.lock; l != nil {
			for _, k := range l.scriptKeys() {
				m.sched.addOrphan(k, l.token, l.kind.perKey(), l.validUntilNow())
			}
			l.finishRelease(fmt.Errorf("shardlock: release: %w", err))
		}
	}
	return failed, err
}

// releaseItem is a lock or an orphaned token that releaseLocks releases.
type releaseItem struct {
	orphan    orphan // an orphaned token, when lock is nil
	lock      *Lock
	ambiguous bool // an earlier try's reply was lost
}

// call is the script call that releases it.
func (it *releaseItem) call() transport.ScriptCall {
	if it.lock == nil {
		return it.orphan.releaseCall()
	}
	return it.lock.releaseCall(handover{})
}

// settle records on it's lock the outcome of its release, cmd, sent at
// sentAt (an orphaned token has no one to tell).
func (it *releaseItem) settle(cmd *redis.Cmd, sentAt time.Time) {
	l := it.lock
	if l == nil {
		return
	}
	result, _, _, err := l.releaseOutcome(cmd, it.ambiguous, sentAt, l.validUntilNow())
	if err != nil {
		result = fmt.Errorf("shardlock: release: %w", err)
	}
	l.finishRelease(result)
}

// beginRelease claims the release of a held lock, once, and stops the
// watchdog's work on it.
func (l *Lock) beginRelease() bool {
	l.mu.Lock()
	if l.state != stateHeld {
		l.mu.Unlock()
		return false
	}
	l.state = stateReleasing
	watched := l.w.rn.watched
	l.mu.Unlock()
	if watched {
		l.m.sched.remove(l)
	}
	return true
}

// finishRelease ends a release claimed by beginRelease with its result.
func (l *Lock) finishRelease(result error) {
	if l.cls != nil { // no clock read without metrics
		l.cls.Released(time.Since(l.acquiredAt), outcomeReason(result))
	}
	l.mu.Lock()
	l.state = stateReleased
	if result != nil {
		if errors.Is(result, ErrLockLost) {
			l.err = lost(result)
		} else {
			l.err = result
		}
	}
	l.endLocked(ErrReleased, true)
	l.mu.Unlock()
	l.m.queues.holderGone(l)
}

// Release gives the lock up with one compare-and-delete. It returns nil when
// it deleted the key, ErrNotHeld when another owner holds the key now,
// ErrExpired when the key is gone, and an error matching ErrLockLost
// (without a round trip) when the lock was already known lost. Transient
// errors are retried while ctx lasts and the lock is still valid; if the
// release could not be confirmed, it goes on in the background until the
// lock's TTL would end. With ctx already ended, Release sends nothing
// itself: it returns ctx's error and the lock is released in the
// background (it stops being renewed). Release returns by ctx's deadline
// whatever the client's timeouts. A second Release makes no round trip
// and returns the first result.
func (l *Lock) Release(ctx context.Context) error {
	if l.zero() {
		return ErrNilLock
	}
	if ctx == nil {
		return invalid("context", "nil")
	}
	validUntil, first, err := l.startRelease(ctx)
	if !first {
		return err
	}
	m := l.m
	r := releaseTry{l: l, validUntil: validUntil}
	if err := m.tr.RetryTransient(ctx, validUntil, r.once); err != nil {
		m.afterRelease(l, r.h, 0, 0, time.Time{}, r.ambiguous)
		if ctx.Err() == nil && !time.Now().Before(validUntil) {
			r.result = ErrExpired // retried until the key's TTL ran out
		} else {
			r.result = fmt.Errorf("shardlock: release: %w", err)
		}
		for _, k := range l.scriptKeys() {
			m.sched.addOrphan(k, l.token, l.kind.perKey(), validUntil)
		}
	}
	if r.result == ErrForceReleased {
		r.result = m.forcedError(l.key, l.token)
	}
	l.finishRelease(r.result)
	if ce := m.log.Check(zap.DebugLevel, "lock released"); ce != nil {
		ce.Write(m.fields(ctx, "released", l, zap.Duration("held", time.Since(l.acquiredAt)), zap.Error(r.result))...)
	}
	return r.result
}

// startRelease claims the release of l for this call (first), stopping
// the watchdog's work on it, and returns its validity. A lock already lost
// answers its error; one already released or being released answers the
// first Release's result once that ends (or ctx's error).
func (l *Lock) startRelease(ctx context.Context) (validUntil time.Time, first bool, err error) {
	l.mu.Lock()
	switch l.state {
	case stateLost:
		err := l.err
		l.mu.Unlock()
		return time.Time{}, false, err
	case stateReleasing, stateReleased:
		l.mu.Unlock()
		select {
		case <-l.Done(): // closes when the first Release finishes
		case <-ctx.Done():
			return time.Time{}, false, ctx.Err()
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		return time.Time{}, false, l.releaseErrLocked()
	}
	l.state = stateReleasing
	validUntil, watched := l.validUntil.Time(), l.w.rn.watched
	l.mu.Unlock()
	if watched {
		l.m.sched.remove(l) // else the scheduler drops it from its incoming list
	}
	return validUntil, true, nil
}

// releaseTry is one Release call's state across its tries.
type releaseTry struct {
	l          *Lock
	validUntil time.Time
	result     error    // the release's outcome, once a try was answered
	ambiguous  bool     // a try's reply was lost: it may have run
	h          handover // this process's next waiter, queued or handed the lock by this release
	handed     bool     // h was chosen (on the first try)
}

// once makes one try of the release.
func (r *releaseTry) once(ctx context.Context) error {
	l, m := r.l, r.l.m
	var sentAt time.Time // read only when needed
	switch {
	case !l.kind.handsOver():
		// A batch or a read-write lock hands nothing to this process's
		// next waiter directly (see kind_rw.go).
		sentAt = time.Now()
	case !r.handed:
		// This process's next waiter for the key, if any, is queued (or
		// handed the lock) by this release.
		r.h, r.handed = m.queues.nextForRelease(l), true
		if m.queues.transfer(l, r.h) {
			r.h = handover{} // settled: the waiter holds the lock
			return nil
		}
		sentAt = r.h.sentAt
	case r.ambiguous || r.h.w != nil:
		sentAt = time.Now()
	}
	result, code, fence, err := l.kind.release(m, ctx, l, r.h.entry, r.h.local, r.ambiguous, sentAt, r.validUntil)
	if err != nil {
		r.ambiguous = r.ambiguous || transport.IsAmbiguous(err)
		return err
	}
	if code == scripts.HandedOver {
		m.queues.sawContended(l.key) // handed to a waiter queued in Redis
	}
	m.afterRelease(l, r.h, code, fence, sentAt, r.ambiguous)
	r.h = handover{} // settled
	r.result = result
	return nil
}

// releaseCall is the call that releases l (its kind's), carrying h's
// entry when this process's next waiter is to be queued or handed the
// lock. Lock.Release and releaseLocks both release through it.
func (l *Lock) releaseCall(h handover) transport.ScriptCall {
	return l.kind.releaseCall(l.scriptKeys(), l.args[:], h.entry, h.local)
}

// releaseOutcome reads the reply of l's release call, cmd (sent at sentAt;
// ambiguous: an earlier try's reply was lost), as the release's result;
// it also returns release.lua's code and a hand-over's fence, or the Redis
// error, for the caller to retry or report.
func (l *Lock) releaseOutcome(cmd *redis.Cmd, ambiguous bool, sentAt, validUntil time.Time) (result error, code int64, fence uint64, err error) {
	return l.kind.releaseResult(l, cmd, ambiguous, sentAt, validUntil)
}

// releaseNow releases a lock acquired after the watchdog stopped (Close).
func (l *Lock) releaseNow() {
	ctx, cancel := context.WithDeadline(context.Background(), l.validUntilNow())
	defer cancel()
	_ = l.Release(ctx)
}

// afterRelease settles a handover with the release script's outcome: code
// as release.lua returns it, or ambiguous when the reply was lost.
func (m *Manager) afterRelease(l *Lock, h handover, code int64, fence uint64, sentAt time.Time, ambiguous bool) {
	if h.w == nil {
		return
	}
	lq := &m.queues
	lq.mu.Lock()
	defer lq.mu.Unlock()
	w := h.w
	w.handing = false
	switch {
	case code == scripts.HandedToNext: // w holds the lock now
		if h.local {
			h.q.streak++
		} else {
			h.q.streak = 0
		}
		if w.took {
			// The waiter's re-check found the lock handed to it first
			// (its own token in the key): it holds the lock already.
			return
		}
		if w.left {
			// The waiter gave up meanwhile: the lock is nobody's.
			m.reap(l.key, w.token, l.kind.perKey(), sentAt.Add(w.ttl))
			return
		}
		w.grant(grantMsg{fence: fence, validFrom: sentAt})
	case code == scripts.HandedOver: // w is queued behind the waiter that got the lock
		h.q.streak = 0
	case ambiguous:
		// w may or may not be queued (or hold the lock): its re-check
		// finds out.
	default: // the script did not run its hand-over: w must attempt
		if w.entry == h.entry {
			w.entry = ""
		}
		w.grant(grantMsg{retry: true})
	}
}
