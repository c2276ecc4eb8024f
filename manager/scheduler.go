package manager

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/metrics"
)

// maxOrphans bounds the tokens kept for background release.
const maxOrphans = 10000

// orphan is a token that may hold a key without anyone knowing: an acquire
// attempt whose reply never came, or a release that could not be
// confirmed. The scheduler releases it until deadline (when the key's TTL
// would have run out anyway).
type orphan struct {
	key, token string
	mode       rwMode // the lock's kind: it says which release script frees it
	deadline   time.Time
	next       time.Time
	tries      int
}

// releaseCall is the script call that releases o.
func (o orphan) releaseCall() transport.ScriptCall {
	release, _, _ := o.mode.scripts()
	return transport.ScriptCall{Script: release, Keys: []string{o.key}, Args: []any{o.token}}
}

// scheduler is the Manager's one background goroutine (the watchdog). It
// keeps every held lock in a heap by the time it must next look at it: to
// renew it (every TTL/3 by default, pipelined with every other lock due in
// the same tick), to fire its max hold, or to declare it lost when its
// validity runs out with no successful renewal. It also releases orphaned
// tokens.
type scheduler struct {
	m *Manager

	mu       sync.Mutex
	locks    lockHeap
	incoming []*Lock // new locks, not yet in the heap (see add)
	inFlight []*Lock // taken out of the heap by collect, until process ends
	orphans  []orphan
	stopped  bool
	taken    bool // Close has taken the orphans (see addOrphan)
	// sleepUntil is when the loop will next wake by itself; an earlier due
	// time must wake it (poke), a later one need not.
	sleepUntil mono
	idle       time.Duration // how long the loop sleeps with nothing to do

	wake   chan struct{}
	ctx    context.Context // cancelled by stop: ends the loop and any batch in flight
	cancel context.CancelFunc
	exited chan struct{}
}

func newScheduler(m *Manager) *scheduler {
	ctx, cancel := context.WithCancel(context.Background())
	s := &scheduler{m: m, wake: make(chan struct{}, 1), ctx: ctx, cancel: cancel, exited: make(chan struct{})}
	// Idle, the loop wakes by itself every half default renew interval,
	// so that a lock with the default options is due after sleepUntil
	// and its acquire need not wake the loop: most locks are released
	// before their first renewal, and then the loop never runs for them.
	s.idle = time.Hour
	if iv := m.defaultAC.interval; iv > 0 && iv/2 < s.idle {
		s.idle = max(iv/2, MinRenewInterval)
	}
	go s.run()
	return s
}

func (s *scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// watchEntry.idx outside the heap.
const (
	idxNone       = -1 // not watched
	idxProcessing = -2 // taken out by collect, being renewed or checked
	idxIncoming   = -3 // in s.incoming, not yet in the heap
)

// drainAt is how many new locks make the loop drain s.incoming early.
const drainAt = 1024

// add starts watching l. It returns false once the scheduler has stopped.
//
// A new lock goes to s.incoming, an append: most locks are released long
// before their first renewal, and the loop drops those when it drains the
// list, so they never cost a heap insertion and removal.
func (s *scheduler) add(l *Lock) bool {
	due, slack := l.nextDueLocked() // l is not shared yet
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return false
	}
	l.wd.due, l.wd.slack, l.wd.idx = due, slack, idxIncoming
	s.incoming = append(s.incoming, l)
	wake := due.Before(s.sleepUntil) || len(s.incoming) >= drainAt
	s.mu.Unlock()
	if wake {
		s.poke()
	}
	return true
}

// schedule moves l to due, if the scheduler still watches it.
func (s *scheduler) schedule(l *Lock, due mono, slack time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	switch {
	case l.wd.idx >= 0:
		l.wd.due, l.wd.slack = due, slack
		heap.Fix(&s.locks, l.wd.idx)
	case l.wd.idx == idxIncoming:
		l.wd.due, l.wd.slack = due, slack
	default:
		return
	}
	if due.Before(s.sleepUntil) {
		s.poke()
	}
}

// remove stops watching l. A lock still in s.incoming stays there until the
// next drain, which drops it since it is no longer held.
func (s *scheduler) remove(l *Lock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.wd.idx >= 0 {
		heap.Remove(&s.locks, l.wd.idx)
	}
}

// drainLocked moves the held locks of s.incoming into the heap. s.mu must be held.
func (s *scheduler) drainLocked() {
	for i, l := range s.incoming {
		l.mu.Lock()
		held := l.state == stateHeld
		l.rn.watched = held // under l.mu: Release and markLost read it there
		l.mu.Unlock()
		if held {
			heap.Push(&s.locks, l)
		} else {
			l.wd.idx = idxNone
		}
		s.incoming[i] = nil
	}
	s.incoming = s.incoming[:0]
}

// addOrphan hands a token that may hold key, until deadline, to the
// reaper. Between stop and take the list still grows, for Close to release:
// an exchange that settles late (Close waits for those) may leave a token
// whose attempt is still on its way, and Close releases the list only once
// that has had its reply. It returns false once Close has taken the list,
// and nothing would run it again.
func (s *scheduler) addOrphan(key, token string, mode rwMode, deadline time.Time) bool {
	if !time.Now().Before(deadline) {
		return true // nothing left to release
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.taken {
		return false
	}
	if len(s.orphans) >= maxOrphans {
		s.m.log.Warn("too many orphaned lock tokens; dropping the oldest", zap.String("event", "orphan_dropped"))
		s.orphans = s.orphans[1:]
	}
	s.orphans = append(s.orphans, orphan{key: key, token: token, mode: mode, deadline: deadline, next: time.Now()})
	s.poke()
	return true
}

// stop ends the goroutine and waits for it; renewals and orphan releases
// in flight are cancelled (see Manager.io for their goroutines).
func (s *scheduler) stop() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.cancel()
	<-s.exited
}

// take hands back, after stop, what the scheduler watched: the locks still
// held and the orphaned tokens.
func (s *scheduler) take() ([]*Lock, []orphan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drainLocked()
	locks := make([]*Lock, len(s.locks))
	copy(locks, s.locks)
	for _, l := range locks {
		l.wd.idx = -1
	}
	s.locks = nil
	orphans := s.orphans
	s.orphans = nil
	s.taken = true
	return locks, orphans
}

// releaseNow releases a lock acquired after the scheduler stopped.
func (s *scheduler) releaseNow(l *Lock) {
	ctx, cancel := context.WithDeadline(context.Background(), l.validUntilNow())
	defer cancel()
	_ = l.Release(ctx)
}

func (s *scheduler) run() {
	defer close(s.exited)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		due, orphans, next := s.collect(now)
		if len(due) > 0 || len(orphans) > 0 {
			s.process(now, due, orphans)
			continue
		}
		wait := s.idle
		if !next.IsZero() {
			wait = next.Sub(now)
		}
		timer.Reset(wait)
		select {
		case <-s.ctx.Done():
			return
		case <-s.wake:
		case <-timer.C:
		}
	}
}

// collect pops the locks due now (or within a quarter of their renew
// interval, so renewals due close together share one pipeline) and the
// orphans due now, and returns when the next one is due.
func (s *scheduler) collect(now time.Time) (due []*Lock, orphans []orphan, next time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drainLocked()
	for len(s.locks) > 0 {
		l := s.locks[0]
		if l.wd.due.After(monoOf(now).Add(l.wd.slack)) {
			next = l.wd.due.Time()
			break
		}
		due = append(due, l)
		heap.Pop(&s.locks)
		s.inFlight = append(s.inFlight, l)
		l.wd.idx = idxProcessing // schedule() may not move it, remove() need not
	}
	kept := s.orphans[:0]
	for _, o := range s.orphans {
		if !o.next.After(now) {
			orphans = append(orphans, o)
			continue
		}
		kept = append(kept, o)
		if next.IsZero() || o.next.Before(next) {
			next = o.next
		}
	}
	s.orphans = kept
	switch {
	case len(due) > 0 || len(orphans) > 0:
		s.sleepUntil = 0 // awake: collect runs again before sleeping
	case next.IsZero():
		s.sleepUntil = monoOf(now).Add(s.idle)
	default:
		s.sleepUntil = monoOf(next)
	}
	return due, orphans, next
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
func (s *scheduler) process(nowTime time.Time, due []*Lock, orphans []orphan) {
	defer func() {
		s.mu.Lock()
		clear(s.inFlight)
		s.inFlight = s.inFlight[:0]
		s.mu.Unlock()
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
		if !l.maxHoldAt.IsZero() && !l.maxFired && !now.Before(l.maxHoldAt) {
			l.maxFired = true
			l.endLocked(ErrMaxHoldExceeded, false)
			l.mu.Unlock()
			s.m.log.Warn("lock reached its max hold; no longer renewed", s.m.fields(context.Background(), "max_hold", l)...)
			l.mu.Lock()
		}
		if !now.Before(l.validUntil) {
			fails := l.rn.fails
			l.mu.Unlock()
			var cause error = &validityError{fails: fails}
			if l.maxFired {
				cause = ErrMaxHoldExceeded
			}
			l.markLost(cause)
			continue
		}
		if l.renewDueLocked(now) {
			l.rn.renewing = true
			r := renewal{l: l, ttl: l.ttl, sentAt: time.Now()}
			if deadline.IsZero() || l.validUntil.Time().Before(deadline) {
				deadline = l.validUntil.Time()
			}
			renewals = append(renewals, r)
			calls = append(calls, transport.ScriptCall{Script: l.extendScript(), Keys: l.scriptKeys(),
				Args: []any{l.token, strconv.FormatInt(r.ttl.Milliseconds(), 10)}})
		}
		d, slack := l.nextDueLocked()
		l.mu.Unlock()
		s.reinsert(l, d, slack)
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
	ctx, cancel := context.WithDeadline(s.ctx, deadline)
	s.m.tr.Go(func() {
		defer cancel()
		transport.RunBatch(ctx, s.m.renew, calls)
		for i, r := range renewals {
			s.renewResult(r, calls[i])
		}
		for i, o := range orphans {
			s.orphanResult(o, calls[len(renewals)+i])
		}
	})
}

// rescheduleHeld moves l to its next due time, if it is still held.
func (s *scheduler) rescheduleHeld(l *Lock) {
	l.mu.Lock()
	held := l.state == stateHeld
	due, slack := l.nextDueLocked()
	l.mu.Unlock()
	if held {
		s.schedule(l, due, slack)
	}
}

// cannotHeal reports whether a renewal error will come again however often
// it is retried: a closed client, a key of another type, no permission.
func cannotHeal(err error) bool {
	return errors.Is(err, redis.ErrClosed) || transport.IsWrongType(err) ||
		transport.HasReplyPrefix(err, "NOPERM")
}

func (s *scheduler) renewResult(r renewal, c transport.ScriptCall) {
	l := r.l
	res, err := c.Cmd.Int64()
	l.mu.Lock()
	l.rn.renewing = false
	fails := l.rn.fails
	l.mu.Unlock()
	switch {
	case err == nil && res == scripts.Done:
		l.cls.Renewed("")
		if fails > 0 {
			s.m.log.Info("lock renewal succeeded again", s.m.fields(context.Background(), "renew_recovered", l, zap.Int("failures", fails))...)
		}
		// renewed reschedules, unless a newer write (an Extend sent while
		// this renewal was in flight) was recorded first: then the lock is
		// rescheduled below, from that write.
		l.renewed(r.sentAt, r.ttl)
		s.rescheduleHeld(l)
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
	l.rn.fails++
	fails = l.rn.fails
	l.rn.next = monoNow().Add(min(transport.TransientBackoff(fails), l.rn.interval))
	l.mu.Unlock()
	if fails == 1 {
		s.m.log.Warn("lock renewal failed; retrying until it succeeds or the lock's validity runs out",
			s.m.fields(context.Background(), "renew_failed", l, zap.Error(err))...)
	}
	s.rescheduleHeld(l)
}

// reinsert puts a lock taken out by collect back into the heap, unless it
// was released or lost meanwhile or the scheduler stopped.
func (s *scheduler) reinsert(l *Lock, due mono, slack time.Duration) {
	l.mu.Lock()
	held := l.state == stateHeld
	l.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.wd.idx >= 0 || !held {
		if l.wd.idx == idxProcessing {
			l.wd.idx = idxNone
		}
		return
	}
	l.wd.due, l.wd.slack = due, slack
	heap.Push(&s.locks, l)
}

func (s *scheduler) orphanResult(o orphan, c transport.ScriptCall) {
	code, _, err := parseRelease(c.Cmd.Result())
	if err == nil && code != scripts.Gone && code != scripts.NotOurs {
		return // released, or handed over
	}
	// Gone or someone else's: the delayed attempt may still land, so look
	// again until the deadline, backing off.
	o.tries++
	o.next = time.Now().Add(transport.TransientBackoff(o.tries + 2))
	if !o.next.Before(o.deadline) {
		return
	}
	s.mu.Lock()
	s.orphans = append(s.orphans, o) // after stop, Close releases what is left
	wake := monoOf(o.next).Before(s.sleepUntil)
	s.mu.Unlock()
	if wake {
		s.poke()
	}
}

// eachHeld yields every lock held now, with its class, for the metrics'
// held-locks and oldest-lock gauges (computed at scrape time).
func (s *scheduler) eachHeld(yield func(c *metrics.Class, acquiredAt time.Time)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, list := range [][]*Lock{s.locks, s.incoming, s.inFlight} {
		for _, l := range list {
			if i == 2 && l.wd.idx != idxProcessing {
				continue // back in the heap already: counted there
			}
			l.mu.Lock()
			held := l.state == stateHeld
			l.mu.Unlock()
			if held {
				yield(l.cls, l.acquiredAt)
			}
		}
	}
}

// lockHeap orders locks by due time.
type lockHeap []*Lock

func (h lockHeap) Len() int           { return len(h) }
func (h lockHeap) Less(i, j int) bool { return h[i].wd.due < h[j].wd.due }
func (h lockHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].wd.idx = i
	h[j].wd.idx = j
}
func (h *lockHeap) Push(x any) {
	l := x.(*Lock)
	l.wd.idx = len(*h)
	*h = append(*h, l)
}
func (h *lockHeap) Pop() any {
	old := *h
	n := len(old)
	l := old[n-1]
	old[n-1] = nil
	l.wd.idx = -1
	*h = old[:n-1]
	return l
}
