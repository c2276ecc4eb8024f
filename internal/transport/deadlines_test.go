package transport

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A caller whose context has a deadline waits on its entry alone: a
// cancellation before that deadline still ends its wait (by the deadline
// watch's sweep), in flight and queued alike, and its command is never
// sent when it was still queued.
func TestCoalescerWatchSeesCancellation(t *testing.T) {
	co, h, inCancel, inFlight := holdOneInFlight(t)
	bg := context.Background()
	qCtx, qCancel := context.WithTimeout(bg, time.Hour)
	defer qCancel()
	queuedErr := make(chan error, 1)
	go func() { queuedErr <- co.Process(qCtx, redis.NewStatusCmd(bg, "set", "b", "queued")) }()
	awaitQueued(t, co, 1)
	inCancel()
	qCancel()
	for name, ch := range map[string]chan error{"in-flight": inFlight, "queued": queuedErr} {
		select {
		case err := <-ch:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("%s command: %v, want the cancellation", name, err)
			}
			if IsAbandoned(err) != (name == "in-flight") {
				t.Fatalf("%s command: %v; abandoned %v", name, err, IsAbandoned(err))
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s command still waits 10 s after its context was cancelled", name)
		}
	}
	h.unhold()
	if err := co.Process(bg, redis.NewStatusCmd(bg, "set", "c", "after")); err != nil {
		t.Fatal(err)
	}
	if h.sent("queued") {
		t.Fatal("a command whose caller had gone before it was sent was sent")
	}
}

// The deadline watch never ends the wait of a later command of an entry
// that was recycled: its word is for one generation.
func TestQueuedExpireIsForOneGeneration(t *testing.T) {
	// An entry of its own, not the pool's: the test leaves it dropped.
	q := &queued{ctx: context.Background(), cmd: redis.NewStatusCmd(context.Background(), "ping"), done: make(chan struct{}, 1)}
	gen := q.generation()
	if !q.move(queuedWaiting, queuedSent) {
		t.Fatal("a fresh entry is not waiting")
	}
	q.answer()
	<-q.done
	if q.expire(gen) {
		t.Fatal("expire acted on an answered entry")
	}
	q.reset() // as recycle does before the pool hands it to the next caller
	q.ctx, q.cmd = context.Background(), redis.NewStatusCmd(context.Background(), "ping")
	if q.expire(gen) {
		t.Fatal("expire acted on a later generation of the entry")
	}
	select {
	case <-q.done:
		t.Fatal("the later command's caller was told to leave")
	default:
	}
	if !q.expire(q.generation()) || q.state() != queuedDropped {
		t.Fatalf("expire of the current generation: state %d, want dropped", q.state())
	}
	q.answer() // a flusher's late answer: no second value
	<-q.done
	select {
	case <-q.done:
		t.Fatal("the entry was signalled twice")
	default:
	}
}

// A caller whose wait ends at its deadline returns once its context says
// so: ctx.Err() is set when Process returns the context's error, as after
// a select on ctx.Done() (callers tell their own deadline from a failure
// by it).
func TestCoalescerWatchReturnsAfterTheContextEnds(t *testing.T) {
	co, _, _, _ := holdOneInFlight(t)
	bg := context.Background()
	const callers = 64
	early := make(chan error, callers)
	for range callers {
		go func() {
			ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
			defer cancel()
			err := co.Process(ctx, redis.NewStatusCmd(bg, "set", "b", "queued"))
			if ctx.Err() == nil {
				early <- err
				return
			}
			early <- nil
		}()
	}
	for range callers {
		if err := <-early; err != nil {
			t.Fatalf("Process returned %v before its context ended", err)
		}
	}
}

// holdOneInFlight returns a coalescer whose sends are held, with one
// command in flight under a context of an hour (cancel ends it; its
// Process's error comes on the channel).
func holdOneInFlight(t *testing.T) (*coalescer, *holdHook, context.CancelFunc, chan error) {
	t.Helper()
	co, h := newHeldCoalescer(t)
	h.hold.Store(true)
	bg := context.Background()
	ctx, cancel := context.WithTimeout(bg, time.Hour)
	t.Cleanup(cancel)
	inFlight := make(chan error, 1)
	go func() { inFlight <- co.Process(ctx, redis.NewStatusCmd(bg, "set", "a", "in-flight")) }()
	<-h.held
	return co, h, cancel, inFlight
}

// awaitQueued waits until n commands wait in co's queues. Nothing signals
// "queued": it polls, bounded.
func awaitQueued(t *testing.T, co *coalescer, n int) {
	t.Helper()
	for i := 0; co.queuedLen() < n; i++ {
		if i == 5000 {
			t.Fatalf("%d of %d commands queued after 5 s", co.queuedLen(), n)
		}
		time.Sleep(time.Millisecond)
	}
}
