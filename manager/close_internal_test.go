package manager

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/sharding"
)

// Close that ends while a batch is in flight says so in its error, as it
// does for any exchange still without a reply: the flusher outlives Close
// until the batch ends.
func TestCloseCountsBatchInFlight(t *testing.T) {
	h := &attemptHook{held: make(chan struct{}), let: make(chan struct{}), early: make(chan struct{})}
	m, _ := newMiniManager(t, h)
	var letOnce sync.Once
	let := func() { letOnce.Do(func() { close(h.let) }) }
	t.Cleanup(let)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- m.cmd.Process(ctx, redis.NewStatusCmd(ctx, "set", "k", "v")) }()
	<-h.held // the flusher sent the batch and waits for its reply
	cancel()
	if err := <-errc; !transport.IsAbandoned(err) {
		t.Fatalf("the caller that left: %v, want an abandoned command", err)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer ccancel()
	err := m.Close(cctx)
	if err == nil || !strings.Contains(err.Error(), "1 exchanges with Redis still without a reply") {
		t.Fatalf("Close with a batch in flight: %v, want it counted", err)
	}
	let()
	if n := m.tr.WaitFlushers(context.Background()); n != 0 {
		t.Fatalf("%d flushers still running after the batch ended", n)
	}
}

// attemptHook holds the first SET a client sends (an acquire attempt) until
// let is closed, and closes early once a script command (a release) sent
// under a context marked by closeMark while that SET is held has its reply.
type attemptHook struct {
	held, let, early chan struct{}
	holding          atomic.Bool
	once, earlyOnce  sync.Once
}

// closeMark marks the context of a test's Close.
type closeMark struct{}

func (h *attemptHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *attemptHook) process(ctx context.Context, cmds []redis.Cmder, next func() error) error {
	release := false
	for _, c := range cmds {
		switch c.Name() {
		case "set":
			h.once.Do(func() {
				h.holding.Store(true)
				close(h.held)
				<-h.let
				h.holding.Store(false)
			})
		case "evalsha", "eval":
			release = release || (h.holding.Load() && ctx.Value(closeMark{}) != nil)
		}
	}
	err := next()
	if release {
		h.earlyOnce.Do(func() { close(h.early) })
	}
	return err
}

func (h *attemptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return h.process(ctx, []redis.Cmder{cmd}, func() error { return next(ctx, cmd) })
	}
}

func (h *attemptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return h.process(ctx, cmds, func() error { return next(ctx, cmds) })
	}
}

// An attempt whose caller left while the coalescer had it in flight is
// released by Close after it has run, not before: released before, it
// would take its key afterwards and hold it for its TTL.
func TestCloseReleasesOrphanAfterItsAttempt(t *testing.T) {
	h := &attemptHook{held: make(chan struct{}), let: make(chan struct{}), early: make(chan struct{})}
	m, mr := newMiniManager(t, h)
	var letOnce sync.Once
	let := func() { letOnce.Do(func() { close(h.let) }) }
	t.Cleanup(let)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := m.TryAcquire(ctx, "k")
		errc <- err
	}()
	<-h.held // the flusher is sending the attempt
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("TryAcquire whose caller left: %v, want context.Canceled", err)
	}
	closed := make(chan error, 1)
	go func() {
		// Only Close's own releases count: the watchdog's, before Close,
		// are tried again until the attempt's TTL would have run out.
		cctx, ccancel := context.WithTimeout(context.WithValue(context.Background(), closeMark{}, true), 10*time.Second)
		defer ccancel()
		closed <- m.Close(cctx)
	}()
	// The attempt goes on once Close waits for the coalescer's goroutines,
	// or once Close's release of the attempt's token has run.
	waiting := make(chan struct{})
	go func() {
		defer close(waiting)
		for range 10000 {
			select {
			case <-h.early:
				return
			default:
			}
			if m.tr.FlushersWaitedOn() {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	<-waiting
	let()
	if err := <-closed; err != nil {
		t.Fatalf("Close = %v", err)
	}
	if key, _ := sharding.LockKey(sharding.DefaultPrefix, "k"); mr.Exists(key) {
		t.Fatal("the key of an attempt whose caller left is held after Close")
	}
}

// Between the watchdog's stop and Close's taking of the orphans, a token
// that an exchange settling late hands to the reaper joins the list Close
// releases (after the commands in flight have their replies); only after
// that does the reaper refuse it.
func TestOrphanAfterStopJoinsClose(t *testing.T) {
	m, _ := newMiniManager(t)
	m.sched.stop() // as Close does first
	deadline := time.Now().Add(time.Minute)
	if !m.sched.addOrphan("shardlock:{k}", "tok", kindExclusive, deadline) {
		t.Fatal("a token handed over after the watchdog stopped, before Close took the list, was refused")
	}
	if _, orphans := m.sched.take(); len(orphans) != 1 || orphans[0].token != "tok" {
		t.Fatalf("Close took %v, want the token handed over after stop", orphans)
	}
	if m.sched.addOrphan("shardlock:{k}", "tok2", kindExclusive, deadline) {
		t.Fatal("a token handed over after Close took the list was accepted: nothing would release it")
	}
}

// goroutineHook records, per command name, whether a command was sent on
// a goroutine running inSender: the caller's, as opposed to one of the
// Manager's (an exchange's or a flusher's).
type goroutineHook struct {
	mu        sync.Mutex
	elsewhere map[string]int // sends on another goroutine, by command
	sends     map[string]int
}

func (h *goroutineHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *goroutineHook) record(cmds ...redis.Cmder) {
	buf := make([]byte, 64<<10)
	onCaller := strings.Contains(string(buf[:runtime.Stack(buf, false)]), "manager.inSender(")
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range cmds {
		h.sends[c.Name()]++
		if !onCaller {
			h.elsewhere[c.Name()]++
		}
	}
}

func (h *goroutineHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.record(cmd); return next(ctx, cmd) }
}

func (h *goroutineHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.record(cmds...); return next(ctx, cmds) }
}

// inSender runs f; the hook finds it on the stack of f's sends.
//
//go:noinline
func inSender(f func()) { f() }

// A lone caller whose context never ends (context.Background), or ends
// later than the attempt can use a reply (a deadline past the TTL), sends
// its commands on its own goroutine: the client bounds each command by the
// attempt's deadline, and nothing else could end the wait. Without a
// client that bounds commands by their context (ContextTimeoutEnabled), a
// command under a context that never ends still goes out on the caller's
// goroutine: a flusher would wait for its reply just as long.
func TestContextsThatNeverEndStayOnTheCallersGoroutine(t *testing.T) {
	for _, bounds := range []bool{true, false} {
		t.Run(map[bool]string{true: "ContextTimeoutEnabled", false: "client timeouts"}[bounds], func(t *testing.T) {
			mr := miniredis.RunT(t)
			c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: bounds})
			t.Cleanup(func() { _ = c.Close() })
			m, err := New(context.Background(), c, WithStartupCheck(false))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.Close(context.Background()) })
			h := &goroutineHook{elsewhere: map[string]int{}, sends: map[string]int{}}
			c.AddHook(h)
			late, cancel := context.WithTimeout(context.Background(), time.Hour) // past the 30 s TTL
			defer cancel()
			for _, ctx := range []context.Context{context.Background(), late} {
				inSender(func() {
					l, err := m.TryAcquire(ctx, "r")
					if err != nil {
						t.Fatal(err)
					}
					// Without ContextTimeoutEnabled the attempt went to a
					// flusher; a release while it still runs joins its
					// queue (as it should), so it is made once the flusher
					// has ended (no signal: poll, bounded).
					for i := 0; m.tr.FlushersBusy(); i++ {
						if i == 5000 {
							t.Fatal("a flusher still runs after 5 s")
						}
						time.Sleep(time.Millisecond)
					}
					if err := l.Release(context.Background()); err != nil {
						t.Fatal(err)
					}
				})
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.sends["set"] != 2 || h.sends["evalsha"] != 2 {
				t.Fatalf("sent %v, want 2 SETs and 2 EVALSHAs", h.sends)
			}
			if n := h.elsewhere["evalsha"]; n > 0 {
				t.Errorf("%d of 2 releases under context.Background() sent on a goroutine of the Manager's", n)
			}
			if n := h.elsewhere["set"]; bounds && n > 0 {
				t.Errorf("%d of 2 attempts sent on a goroutine of the Manager's", n)
			}
		})
	}
}

// exchangeHook records, at each EVALSHA sent, how many exchanges the
// Manager had in flight on goroutines of its own, and holds that send
// while hold is set, until release is closed.
type exchangeHook struct {
	m        atomic.Pointer[Manager]
	hold     atomic.Bool
	held     chan struct{}
	release  chan struct{}
	mu       sync.Mutex
	inFlight []int64
}

func (h *exchangeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *exchangeHook) record(cmds ...redis.Cmder) {
	for _, c := range cmds {
		if c.Name() != "evalsha" {
			continue
		}
		h.mu.Lock()
		h.inFlight = append(h.inFlight, h.m.Load().tr.Exchanges())
		h.mu.Unlock()
		if h.hold.Load() {
			select {
			case h.held <- struct{}{}:
			default:
			}
			<-h.release
		}
	}
}

func (h *exchangeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.record(cmd); return next(ctx, cmd) }
}

func (h *exchangeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.record(cmds...); return next(ctx, cmds) }
}

// A release under a context that can be cancelled but has no deadline (a
// request's context, say) waits for its reply in the coalescer alone, with
// no exchange goroutine of the Manager's beside it, and still returns as
// soon as its context is cancelled.
func TestCancellableReleaseWaitsInTheCoalescer(t *testing.T) {
	h := &exchangeHook{held: make(chan struct{}, 1), release: make(chan struct{})}
	m, _ := newMiniManager(t, h)
	h.m.Store(m)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l, err := m.TryAcquire(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	// The attempt ran on an exchange goroutine, which counts itself out
	// just after its caller has the answer (no signal: poll, bounded).
	for i := 0; m.tr.Exchanges() != 0; i++ {
		if i == 5000 {
			t.Fatal("the attempt's exchange still in flight after 5 s")
		}
		time.Sleep(time.Millisecond)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	if len(h.inFlight) != 1 || h.inFlight[0] != 0 {
		t.Errorf("exchanges in flight beside the release's EVALSHA: %v, want [0]", h.inFlight)
	}
	h.mu.Unlock()

	// Cancelled while its EVALSHA is in flight, the release returns at once.
	l, err = m.TryAcquire(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	h.hold.Store(true)
	defer func() { h.hold.Store(false); close(h.release) }()
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Release(rctx) }()
	<-h.held
	rcancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Release cancelled in flight: %v, want an error matching context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Release did not return after its context was cancelled")
	}
}

// lanesBusy reports whether a flusher (or a lone caller sending) runs on
// any of co's lanes.

// The bound on pipelines in flight is the process's (it comes from the
// process's CPUs): several managers in one process share it, so that
// together they keep as many in flight as one would, in larger batches.
// (How coalescers apply a shared bound: internal/transport's tests.)
func TestManagersShareTheProcessBound(t *testing.T) {
	m1, _ := newMiniManager(t)
	m2, _ := newMiniManager(t)
	if f := m1.tr.Flushers(); f == nil || f != m2.tr.Flushers() {
		t.Fatal("the managers' coalescers count their flushers apart from the process's")
	}
}
