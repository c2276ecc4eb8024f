package manager

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/metrics"
	"go.uber.org/zap"
)

// renewDueLocked reports whether the watchdog should send a renewal of l
// at now: one is due (within its slack) and none is in flight.
func (l *Lock) renewDueLocked(now mono) bool {
	if (!l.w.rn.watchdog && !l.w.rn.claimed) || l.w.rn.maxFired || l.w.rn.renewing {
		return false
	}
	return !now.Add(l.renewSlackLocked()).Before(l.w.rn.next)
}

func (m *Manager) runWatchdog() {
	defer close(m.sched.exited)
	defer m.sched.timer.Stop()
	for {
		now := time.Now()
		due, orphans := m.sched.collect(now) // sets the timer when nothing is due
		if len(due) > 0 || len(orphans) > 0 {
			m.renewDue(now, due, orphans)
			continue
		}
		select {
		case <-m.sched.ctx.Done():
			return
		case <-m.sched.wake:
		case <-m.sched.timer.C:
		}
	}
}

type renewal struct {
	l      *Lock
	ttl    time.Duration
	sentAt time.Time
}

// process handles what collect found due: it fires max holds, declares
// lost the locks whose validity ran out, and sends the renewals and
// orphan releases due, in one pipeline per node, on a goroutine of their
// own: the loop never waits for Redis, so a renewal stuck in I/O cannot
// delay another lock's loss (a lock being renewed stays in the heap, due
// at the end of its validity).
func (m *Manager) renewDue(nowTime time.Time, due []*Lock, orphans []orphan) {
	defer func() {
		m.sched.mu.Lock()
		clear(m.sched.inFlight)
		m.sched.inFlight = m.sched.inFlight[:0]
		m.sched.mu.Unlock()
	}()
	now := monoOf(nowTime)
	var (
		renewals []renewal
		calls    []transport.ScriptCall
		deadline time.Time
	)
	for _, l := range due {
		l.mu.Lock()
		if l.state != stateHeld {
			l.mu.Unlock()
			continue
		}
		if !l.w.rn.maxHoldAt.IsZero() && !l.w.rn.maxFired && !now.Before(l.w.rn.maxHoldAt) {
			l.w.rn.maxFired = true
			l.endLocked(ErrMaxHoldExceeded, false)
			l.mu.Unlock()
			m.log.Warn("lock reached its max hold; no longer renewed", m.fields(context.Background(), "max_hold", l)...)
			l.mu.Lock()
		}
		if !now.Before(l.validUntil) {
			fails := l.w.rn.fails
			l.mu.Unlock()
			var cause error = &validityError{fails: fails}
			if l.w.rn.maxFired {
				cause = ErrMaxHoldExceeded
			}
			l.markLost(cause)
			continue
		}
		if l.renewDueLocked(now) {
			l.w.rn.renewing = true
			r := renewal{l: l, ttl: l.ttl, sentAt: time.Now()}
			if deadline.IsZero() || l.validUntil.Time().Before(deadline) {
				deadline = l.validUntil.Time()
			}
			renewals = append(renewals, r)
			calls = append(calls, l.kind.extendCall(l.scriptKeys(), l.args[0], strconv.FormatInt(r.ttl.Milliseconds(), 10)))
		}
		d, slack := l.nextDueLocked()
		l.mu.Unlock()
		m.sched.reinsert(l, d, slack)
	}
	for _, o := range orphans {
		calls = append(calls, o.releaseCall())
		if deadline.IsZero() || o.deadline.Before(deadline) {
			deadline = o.deadline
		}
	}
	if len(calls) == 0 {
		return
	}
	// One pipeline per node; bounded by the earliest validity in the batch,
	// and by Close.
	ctx, cancel := context.WithDeadline(m.sched.ctx, deadline)
	m.tr.Go(func() {
		defer cancel()
		transport.RunBatch(ctx, m.renew, calls)
		for i, r := range renewals {
			m.renewResult(r, calls[i])
		}
		for i, o := range orphans {
			m.orphanResult(o, calls[len(renewals)+i])
		}
	})
}

// cannotHeal reports whether a renewal error will come again however often
// it is retried: a closed client, a key of another type, no permission.
func cannotHeal(err error) bool {
	return errors.Is(err, redis.ErrClosed) || transport.IsWrongType(err) ||
		transport.HasReplyPrefix(err, "NOPERM")
}

func (m *Manager) renewResult(r renewal, c transport.ScriptCall) {
	l := r.l
	res, err := c.Cmd.Int64()
	l.mu.Lock()
	l.w.rn.renewing = false
	fails := l.w.rn.fails
	l.mu.Unlock()
	switch {
	case err == nil && res == scripts.Done:
		l.cls.Renewed("")
		if fails > 0 {
			m.log.Info("lock renewal succeeded again", m.fields(context.Background(), "renew_recovered", l, zap.Int("failures", fails))...)
		}
		// renewed reschedules, unless a newer write (an Extend sent while
		// this renewal was in flight) was recorded first: then the lock is
		// rescheduled below, from that write.
		l.renewed(r.sentAt, r.ttl)
		m.sched.rescheduleHeld(l)
		return
	case err == nil:
		cause := l.heldCause(res)
		if cause == nil {
			cause = ErrNotHeld // a reply no script gives
		}
		l.cls.Renewed(outcomeReason(cause))
		l.markLost(cause)
		return
	case cannotHeal(err):
		l.cls.Renewed(metrics.ReasonRedisError)
		l.markLost(fmt.Errorf("renewal cannot succeed: %w", err))
		return
	}
	// Transient or unknown: try again, backing off (jittered, doubling
	// from 10 ms to 500 ms, at most the renew interval), while the lock is
	// still valid. One log line when renewals start failing; the next
	// success or the loss says how many failed.
	l.cls.Renewed(metrics.ReasonRedisError)
	l.mu.Lock()
	l.w.rn.fails++
	fails = l.w.rn.fails
	l.w.rn.next = monoNow().Add(min(transport.TransientBackoff(fails), l.w.rn.interval))
	l.mu.Unlock()
	if fails == 1 {
		m.log.Warn("lock renewal failed; retrying until it succeeds or the lock's validity runs out",
			m.fields(context.Background(), "renew_failed", l, zap.Error(err))...)
	}
	m.sched.rescheduleHeld(l)
}
