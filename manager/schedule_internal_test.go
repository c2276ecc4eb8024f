package manager

import (
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestSchedulerMovesItsTimerForAnEarlyLock: a lock due before the
// watchdog loop's next wake moves the loop's timer to its due time rather
// than waking the loop now (a lock released before then needs no run of
// the loop at all); a lock due later changes nothing.
func TestSchedulerMovesItsTimerForAnEarlyLock(t *testing.T) {
	s := newScheduler(zap.NewNop(), time.Hour) // idle: half an hour
	defer s.timer.Stop()
	s.collect(time.Now()) // as the loop does before it sleeps
	idleUntil := s.sleepUntil
	lockDue := func(in time.Duration) (*Lock, mono) {
		due := monoNow().Add(in)
		a := &lockAndWatch{
			l: Lock{state: stateHeld, validUntil: monoNow().Add(time.Hour)},
			w: watch{rn: renewState{watchdog: true, interval: time.Second, next: due}, wd: watchEntry{idx: idxNone}},
		}
		a.l.w = &a.w
		return &a.l, due
	}

	early, due := lockDue(50 * time.Millisecond)
	if !s.add(early) {
		t.Fatal("add: the scheduler has stopped")
	}
	select {
	case <-s.wake:
		t.Fatal("a lock due in 50 ms woke the loop at once")
	default:
	}
	if s.sleepUntil != due {
		t.Fatalf("sleepUntil = %v from now, want the lock's due time, %v", s.sleepUntil.Sub(monoNow()), due.Sub(monoNow()))
	}

	later, _ := lockDue(time.Minute)
	s.add(later)
	if s.sleepUntil != due || len(s.wake) != 0 {
		t.Fatalf("a lock due later moved sleepUntil to %v from now (want %v) or woke the loop (%d)", s.sleepUntil.Sub(monoNow()), due.Sub(monoNow()), len(s.wake))
	}

	select {
	case <-s.timer.C: // at the early lock's due time, not after the idle half hour
	case <-time.After(time.Minute):
		t.Fatalf("the loop's timer did not fire by the early lock's due time (idle until %v from now)", idleUntil.Sub(monoNow()))
	}
	due2, _ := s.collect(time.Now())
	if len(due2) != 1 || due2[0] != early {
		t.Fatalf("collect at the timer: %d locks due, want the early one", len(due2))
	}
}
