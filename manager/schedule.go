package manager

import (
	"container/heap"
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/shardlock/shardlock/metrics"
)

// newScheduler returns a scheduler whose loop (Manager.runWatchdog) is yet
// to start; interval is the default renew interval.
func newScheduler(log *zap.Logger, interval time.Duration) *scheduler {
	ctx, cancel := context.WithCancel(context.Background())
	s := &scheduler{log: log, wake: make(chan struct{}, 1), ctx: ctx, cancel: cancel, exited: make(chan struct{}),
		timer: time.NewTimer(time.Hour)}
	s.timer.Stop() // set by the loop's collect
	// Idle, the loop wakes by itself every half default renew interval,
	// so that a lock with the default options is due after sleepUntil
	// and its acquire need not wake the loop: most locks are released
	// before their first renewal, and then the loop never runs for them.
	s.idle = time.Hour
	if iv := interval; iv > 0 && iv/2 < s.idle {
		s.idle = max(iv/2, MinRenewInterval)
	}
	return s
}

func (s *scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// wakeByLocked makes the loop, asleep until s.sleepUntil, wake by due
// instead, if that is earlier: it moves the loop's timer rather than
// waking the loop now, so a lock released before its first due time (a
// hand-over's claim lease is confirmed after 50 ms; most locks are
// released long before) costs the loop no run at all when another lock
// had brought the timer that far forward, and one run at due otherwise,
// not two. s.mu must be held.
func (s *scheduler) wakeByLocked(due mono) {
	if !due.Before(s.sleepUntil) {
		return // awake (zero), or waking by due anyway
	}
	s.sleepUntil = due
	s.timer.Reset(due.Sub(monoNow()))
}

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
	l.w.wd.due, l.w.wd.slack, l.w.wd.idx = due, slack, idxIncoming
	s.incoming = append(s.incoming, l)
	s.wakeByLocked(due)
	drain := len(s.incoming) >= drainAt
	s.mu.Unlock()
	if drain {
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
	case l.w.wd.idx >= 0:
		l.w.wd.due, l.w.wd.slack = due, slack
		heap.Fix(&s.locks, l.w.wd.idx)
	case l.w.wd.idx == idxIncoming:
		l.w.wd.due, l.w.wd.slack = due, slack
	default:
		return
	}
	s.wakeByLocked(due)
}

// remove stops watching l. A lock still in s.incoming stays there until the
// next drain, which drops it since it is no longer held.
func (s *scheduler) remove(l *Lock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.w.wd.idx >= 0 {
		heap.Remove(&s.locks, l.w.wd.idx)
	}
}

// drainLocked moves the held locks of s.incoming into the heap. s.mu must be held.
func (s *scheduler) drainLocked() {
	for i, l := range s.incoming {
		l.mu.Lock()
		held := l.state == stateHeld
		l.w.rn.watched = held // under l.mu: Release and markLost read it there
		l.mu.Unlock()
		if held {
			heap.Push(&s.locks, l)
		} else {
			l.w.wd.idx = idxNone
		}
		s.incoming[i] = nil
	}
	s.incoming = s.incoming[:0]
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
		l.w.wd.idx = -1
	}
	s.locks = nil
	orphans := s.orphans
	s.orphans = nil
	s.taken = true
	return locks, orphans
}

// eachHeld yields every lock held now, with its class, for the metrics'
// held-locks and oldest-lock gauges (computed at scrape time).
func (s *scheduler) eachHeld(yield func(c *metrics.Class, acquiredAt time.Time)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, list := range [][]*Lock{s.locks, s.incoming, s.inFlight} {
		for _, l := range list {
			if i == 2 && l.w.wd.idx != idxProcessing {
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

func (h lockHeap) Len() int           { return len(h) }
func (h lockHeap) Less(i, j int) bool { return h[i].w.wd.due < h[j].w.wd.due }
func (h lockHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].w.wd.idx = i
	h[j].w.wd.idx = j
}
func (h *lockHeap) Push(x any) {
	l := x.(*Lock)
	l.w.wd.idx = len(*h)
	*h = append(*h, l)
}
func (h *lockHeap) Pop() any {
	old := *h
	n := len(old)
	l := old[n-1]
	old[n-1] = nil
	l.w.wd.idx = -1
	*h = old[:n-1]
	return l
}

// nextDueLocked returns when the scheduler must look at the lock next, and
// how much earlier it may: a renewal may go up to a quarter interval
// early, to share a pipeline with others due close to it; a retry after a
// failed renewal, the max hold and the end of validity may not.
func (l *Lock) nextDueLocked() (mono, time.Duration) {
	due, slack := l.validUntil, time.Duration(0)
	if (l.w.rn.watchdog || l.w.rn.claimed) && !l.w.rn.maxFired && !l.w.rn.renewing && l.w.rn.next.Before(due) {
		due, slack = l.w.rn.next, l.renewSlackLocked()
	}
	if !l.w.rn.maxHoldAt.IsZero() && !l.w.rn.maxFired && l.w.rn.maxHoldAt.Before(due) {
		due, slack = l.w.rn.maxHoldAt, 0
	}
	return due, slack
}

// renewSlackLocked is how early a renewal may go: a quarter interval, to
// share a pipeline with the renewals due close to it; none for a retry
// after a failed renewal, which keeps its backoff, nor for the confirmation
// of a claim lease, which a release within the lease makes unnecessary.
func (l *Lock) renewSlackLocked() time.Duration {
	if l.w.rn.fails > 0 || l.w.rn.claimed {
		return 0
	}
	return l.w.rn.interval / 4
}

// collect pops the locks due now (or within a quarter of their renew
// interval, so renewals due close together share one pipeline) and the
// orphans due now. With none, it sets the loop's timer to when the next
// one is due (or to the end of the idle rest).
func (s *scheduler) collect(now time.Time) (due []*Lock, orphans []orphan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drainLocked()
	var next time.Time
	for len(s.locks) > 0 {
		l := s.locks[0]
		if l.w.wd.due.After(monoOf(now).Add(l.w.wd.slack)) {
			next = l.w.wd.due.Time()
			break
		}
		due = append(due, l)
		heap.Pop(&s.locks)
		s.inFlight = append(s.inFlight, l)
		l.w.wd.idx = idxProcessing // schedule() may not move it, remove() need not
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
		return due, orphans
	case next.IsZero():
		s.sleepUntil = monoOf(now).Add(s.idle)
	default:
		s.sleepUntil = monoOf(next)
	}
	s.timer.Reset(s.sleepUntil.Sub(monoOf(now)))
	return due, orphans
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

// reinsert puts a lock taken out by collect back into the heap, unless it
// was released or lost meanwhile or the scheduler stopped.
func (s *scheduler) reinsert(l *Lock, due mono, slack time.Duration) {
	l.mu.Lock()
	held := l.state == stateHeld
	l.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.w.wd.idx >= 0 || !held {
		if l.w.wd.idx == idxProcessing {
			l.w.wd.idx = idxNone
		}
		return
	}
	l.w.wd.due, l.w.wd.slack = due, slack
	heap.Push(&s.locks, l)
}
