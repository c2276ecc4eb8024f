package transport

import (
	"context"
	"sync"
	"time"
)

// deadlineWatch ends the waits of a coalescer's callers whose contexts
// have a deadline, so that such a caller waits on its entry's channel
// alone: a select on its context's Done as well costs each call the
// context's channel and a two-way select, a tenth of the client's work
// per call where many callers share a pipeline. One timer serves every
// such caller: it is due at the earliest deadline among them, and at
// least every cancelSweep while any waits, when it also ends the waits of
// callers whose contexts were cancelled before their deadline. So a caller
// stops waiting at its deadline, as one with a select would, and within
// cancelSweep of an earlier cancellation (the reply, as a rule, comes long
// before).
type deadlineWatch struct {
	mu  *sync.Mutex // the coalescer's: guards the fields below
	run *inflight   // counts the timer while it is armed, for Close

	entries []watchEntry
	due     time.Time // when the timer fires next; zero while it is not armed
	timer   *time.Timer
}

// watchEntry is one watched caller: its entry, of generation gen, and its
// context, whose deadline is at.
type watchEntry struct {
	q   *queued
	gen uint64
	ctx context.Context
	at  time.Time
}

// cancelSweep bounds how long a caller whose context is cancelled before
// its deadline waits for its reply (see deadlineWatch).
const cancelSweep = 20 * time.Millisecond

// settled reports whether e's caller has its answer, or its word to
// leave: the watch has nothing more to do for it.
func (e *watchEntry) settled() bool {
	w := e.q.st.Load()
	return w>>generationLsb != e.gen || w&signalledBit != 0
}

// watchLocked has the watch end q's wait at ctx's deadline at. w.mu
// must be held.
func (w *deadlineWatch) watchLocked(q *queued, ctx context.Context, at time.Time) {
	i := 0 // replies mostly come in the order of the calls: settled entries gather at the front
	for i < len(w.entries) && w.entries[i].settled() {
		i++
	}
	clear(w.entries[:i])
	w.entries = append(w.entries[i:], watchEntry{q: q, gen: q.generation(), ctx: ctx, at: at})
	switch {
	case w.due.IsZero():
		w.run.add() // the timer's run, which Close waits for (see sweep)
		w.due = earliest(at, time.Now().Add(cancelSweep))
		if w.timer == nil {
			w.timer = time.AfterFunc(time.Until(w.due), w.sweep)
		} else {
			w.timer.Reset(time.Until(w.due))
		}
	case at.Before(w.due) && w.timer.Stop():
		w.due = at
		w.timer.Reset(time.Until(at))
	}
	// A timer that could not be stopped is firing: its sweep, which waits
	// for co.mu, sees the new entry.
}

// sweep is the deadline watch's timer: it ends the waits of the callers
// whose contexts have ended, and arms the timer again while any wait.
func (w *deadlineWatch) sweep() {
	w.mu.Lock()
	if w.sweepLocked(time.Now()) {
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	w.run.done()
}

// sweepLocked ends the waits of the watched callers whose contexts have
// ended by now, drops the settled entries and arms the timer for the rest.
// It reports whether the timer is armed: false once no caller waits. w.mu
// must be held, and the timer must not be pending.
func (w *deadlineWatch) sweepLocked(now time.Time) bool {
	kept := w.entries[:0]
	next := now.Add(cancelSweep)
	for _, e := range w.entries {
		if e.settled() {
			continue
		}
		if !now.Before(e.at) || e.ctx.Err() != nil {
			e.q.expire(e.gen)
			continue
		}
		kept = append(kept, e)
		next = earliest(next, e.at)
	}
	clear(w.entries[len(kept):])
	w.entries = kept
	if len(kept) == 0 {
		w.due = time.Time{}
		return false
	}
	w.due = next
	w.timer.Reset(next.Sub(now))
	return true
}

// unwatchSettled disarms the deadline watch when no caller waits on it
// (Close: a timer armed for the callers already answered would hold the
// close up until it fires). w.mu must be held.
func (w *deadlineWatch) unwatchSettled() {
	if w.due.IsZero() || !w.timer.Stop() {
		return // not armed, or firing: its sweep settles it
	}
	if w.sweepLocked(time.Now()) {
		return
	}
	w.run.done()
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
