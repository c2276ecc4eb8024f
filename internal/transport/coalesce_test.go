package transport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// holdHook counts the SETs a client sends (single commands and pipelines,
// and the commands in them by last argument) and, while hold is set, holds
// every send until release is closed.
type holdHook struct {
	hold      atomic.Bool
	once      sync.Once
	holding   atomic.Int64  // sends held now
	heldCmds  atomic.Int64  // the commands in the sends held so far
	maxHeld   atomic.Int64  // most sends held at once
	held      chan struct{} // signalled when a send is held
	release   chan struct{}
	sends     atomic.Int64
	mu        sync.Mutex
	sentNames []string
}

func (h *holdHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdHook) record(cmds ...redis.Cmder) {
	if cmds[0].Name() != "set" {
		return // the connection's handshake
	}
	h.sends.Add(1)
	h.mu.Lock()
	for _, c := range cmds {
		h.sentNames = append(h.sentNames, fmt.Sprint(c.Args()[len(c.Args())-1]))
	}
	h.mu.Unlock()
	if h.hold.Load() {
		h.heldCmds.Add(int64(len(cmds)))
		n := h.holding.Add(1)
		for m := h.maxHeld.Load(); n > m && !h.maxHeld.CompareAndSwap(m, n); m = h.maxHeld.Load() {
		}
		select {
		case h.held <- struct{}{}:
		default:
		}
		<-h.release
		h.holding.Add(-1)
	}
}

// unhold stops holding sends and lets the held ones go.
func (h *holdHook) unhold() {
	h.once.Do(func() {
		h.hold.Store(false)
		close(h.release)
	})
}

func (h *holdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.record(cmd); return next(ctx, cmd) }
}

func (h *holdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.record(cmds...); return next(ctx, cmds) }
}

func (h *holdHook) sent(last string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range h.sentNames {
		if n == last {
			return true
		}
	}
	return false
}

// newHeldClient returns a client on a fresh miniredis with a holdHook.
func newHeldClient(t *testing.T) (*redis.Client, *holdHook) {
	t.Helper()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	h := &holdHook{held: make(chan struct{}, 1), release: make(chan struct{})}
	c.AddHook(h)
	return c, h
}

func newHeldCoalescer(t *testing.T) (*coalescer, *holdHook) {
	t.Helper()
	c, h := newHeldClient(t)
	co := testCoalescer(c)
	t.Cleanup(func() { co.close(context.Background()) })
	t.Cleanup(h.unhold) // first: a failed test may have sends held
	return co, h
}

// Concurrent callers' commands go out in fewer round trips than commands:
// with one pipeline in flight, the commands queued meanwhile go together.
func TestCoalescerBatches(t *testing.T) {
	co, h := newHeldCoalescer(t)
	co.maxFlushers = 1
	h.hold.Store(true)
	ctx := context.Background()
	first := make(chan error, 1)
	go func() { first <- co.Process(ctx, redis.NewStatusCmd(ctx, "set", "k0", "v")) }()
	<-h.held // the first command's round trip is in flight; the rest queue
	var wg sync.WaitGroup
	const n = 50
	for i := range n {
		wg.Go(func() {
			cmd := redis.NewStatusCmd(ctx, "set", fmt.Sprintf("k%d", i+1), "v")
			if err := co.Process(ctx, cmd); err != nil {
				t.Error(err)
			}
		})
	}
	// Every caller is queued before the first round trip ends (the queue
	// has no signal: poll it, bounded).
	for i := 0; ; i++ {
		queued := co.queuedLen()
		if queued == n {
			break
		}
		if i == 5000 {
			t.Fatalf("%d of %d callers queued after 5 s", queued, n)
		}
		time.Sleep(time.Millisecond)
	}
	h.unhold()
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if got := h.sends.Load(); got != 2 {
		t.Fatalf("%d round trips for %d commands, want 2 (one, then one pipeline)", got, n+1)
	}
}

// A caller whose context ends before its command is sent gets its
// context's error at once, and the command is never sent; one whose
// command is in flight gets an *abandonedError by its deadline.
func TestCoalescerDeadlines(t *testing.T) {
	co, h := newHeldCoalescer(t)
	h.hold.Store(true)
	bg := context.Background()
	inFlight := make(chan error, 1)
	ictx, icancel := context.WithTimeout(bg, 200*time.Millisecond)
	defer icancel()
	go func() { inFlight <- co.Process(ictx, redis.NewStatusCmd(bg, "set", "a", "in-flight")) }()
	<-h.held

	qctx, qcancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer qcancel()
	start := time.Now()
	err := co.Process(qctx, redis.NewStatusCmd(bg, "set", "b", "queued"))
	if !errors.Is(err, context.DeadlineExceeded) || IsAbandoned(err) {
		t.Fatalf("queued command: %v, want the context's error, not an abandoned call", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("returned after %v", d)
	}
	if err := <-inFlight; !IsAbandoned(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("in-flight command: %v, want an abandoned call", err)
	}
	h.unhold()
	// The flusher goes on; the dropped command is never sent.
	if err := co.Process(bg, redis.NewStatusCmd(bg, "set", "c", "after")); err != nil {
		t.Fatal(err)
	}
	if h.sent("queued") {
		t.Fatal("a command whose caller had gone before it was sent was sent")
	}
	if !h.sent("in-flight") || !h.sent("after") {
		t.Fatal("commands missing")
	}
}

// A queued command's entry is reused for a later command only after its
// caller took the answer. The entry of a caller that left while its
// command was in flight still gets that command's answer, and the entry
// of one that left while it was queued stays in the queue until a flusher
// passes it. Reused, either is refilled by a later caller while the
// flusher still holds it: the flusher then meets a nil command, or answers
// the later caller before its reply.
func TestCoalescerReusesNoEntryOfALeftCaller(t *testing.T) {
	co, h := newHeldCoalescer(t)
	co.maxFlushers = 1
	h.hold.Store(true)
	bg := context.Background()
	// Contexts without deadlines: the commands queue for the flusher
	// (a lone caller with a deadline sends its own).
	inCtx, inCancel := context.WithCancel(bg)
	inFlight := make(chan error, 1)
	go func() { inFlight <- co.Process(inCtx, redis.NewStatusCmd(bg, "set", "a", "in-flight")) }()
	<-h.held
	qCtx, qCancel := context.WithCancel(bg)
	queuedErr := make(chan error, 1)
	go func() { queuedErr <- co.Process(qCtx, redis.NewStatusCmd(bg, "set", "b", "queued")) }()
	for i := 0; co.queuedLen() < 1; i++ { // no signal for "queued": poll, bounded
		if i == 5000 {
			t.Fatal("the second command is not queued after 5 s")
		}
		time.Sleep(time.Millisecond)
	}
	inCancel()
	if err := <-inFlight; !IsAbandoned(err) {
		t.Fatalf("in-flight command: %v, want an abandoned call", err)
	}
	qCancel()
	if err := <-queuedErr; !errors.Is(err, context.Canceled) || IsAbandoned(err) {
		t.Fatalf("queued command: %v, want the context's error", err)
	}
	// Later callers, queued behind the held batch.
	const n = 8
	cmds := make([]*redis.StatusCmd, n)
	errs := make(chan error, n)
	for i := range cmds {
		cmds[i] = redis.NewStatusCmd(bg, "set", fmt.Sprintf("k%d", i), fmt.Sprintf("later-%d", i))
		go func() { errs <- co.Process(bg, cmds[i]) }()
	}
	for i := 0; co.queuedLen() < n+1; i++ {
		if i == 5000 {
			t.Fatalf("%d of %d later commands queued after 5 s", co.queuedLen()-1, n)
		}
		time.Sleep(time.Millisecond)
	}
	h.unhold()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i, cmd := range cmds {
		if cmd.Val() != "OK" {
			t.Fatalf("later command %d returned before its reply (value %q)", i, cmd.Val())
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	counts := map[string]int{}
	for _, name := range h.sentNames {
		counts[name]++
	}
	for i := range n {
		if c := counts[fmt.Sprintf("later-%d", i)]; c != 1 {
			t.Fatalf("later command %d sent %d times", i, c)
		}
	}
	if counts["queued"] != 0 {
		t.Fatal("the command of a caller that left before it was sent was sent")
	}
}

// A queue that grows behind a pipeline in flight gets more flushers, up to
// the coalescer's bound, and no more.
func TestCoalescerFlushersBounded(t *testing.T) {
	co, h := newHeldCoalescer(t)
	h.hold.Store(true)
	ctx := context.Background()
	var wg sync.WaitGroup
	const n = 100
	wg.Go(func() {
		if err := co.Process(ctx, redis.NewStatusCmd(ctx, "set", "k0", "v")); err != nil {
			t.Error(err)
		}
	})
	<-h.held // one pipeline in flight: the rest queue behind it
	for i := 1; i < n; i++ {
		wg.Go(func() {
			if err := co.Process(ctx, redis.NewStatusCmd(ctx, "set", fmt.Sprintf("k%d", i), "v")); err != nil {
				t.Error(err)
			}
		})
	}
	// Every caller's command is queued or held, and every flusher started
	// has its send held: nothing moves until the sends are let go (no
	// signal: poll, bounded). A flusher started but not yet sending would
	// otherwise send only after them.
	for i := 0; co.queuedLen()+int(h.heldCmds.Load()) < n || h.holding.Load() != int64(co.flushers.Load()); i++ {
		if i == 5000 {
			t.Fatalf("%d queued, %d held, %d of %d flushers held after 5 s", co.queuedLen(), h.heldCmds.Load(), h.holding.Load(), co.flushers.Load())
		}
		time.Sleep(time.Millisecond)
	}
	h.unhold()
	wg.Wait()
	if got := h.maxHeld.Load(); got < 2 || got > int64(co.maxFlushers) {
		t.Fatalf("%d pipelines in flight at once, want 2 to %d", got, co.maxFlushers)
	}
	if got := h.sends.Load(); got >= n/4 {
		t.Fatalf("%d round trips for %d commands", got, n)
	}
}

// A flusher between two batches takes the lane's queue itself: commands
// queued meanwhile start no other flusher (two would split the queue into
// smaller batches, which cost the server more per command). Behind a batch
// in flight they do, up to the bounds.
func TestCoalescerNoFlusherBesideOneBetweenBatches(t *testing.T) {
	co := &coalescer{maxFlushers: 4, flushers: new(atomic.Int32)}
	co.flushers.Store(1)
	l := &lane{flushers: 1, queue: make([]*queued, 64), sent: 8}
	if co.another(l) {
		t.Fatal("a second flusher beside one between batches")
	}
	l.sending = 1
	if !co.another(l) {
		t.Fatal("no second flusher behind a batch in flight")
	}
	l.queue = l.queue[:7]
	if co.another(l) {
		t.Fatal("a second flusher for fewer commands than the last batch held")
	}
	co.flushers.Store(co.maxFlushers)
	l.queue = l.queue[:64]
	if co.another(l) {
		t.Fatal("a flusher beyond the coalescer's bound")
	}
	if !co.another(&lane{}) {
		t.Fatal("no flusher for a lane without one")
	}
}

// Coalescers that share a bound share it: the flushers one of them runs
// count against the other's. (How one coalescer applies the bound: the
// test above.)
func TestCoalescersShareABound(t *testing.T) {
	c, _ := newHeldClient(t)
	tp, _ := newTopology(c)
	b := NewFlusherBound()
	c1, c2 := newCoalescer(c, tp, b), newCoalescer(c, tp, b)
	if c1.flushers != c2.flushers {
		t.Fatal("two coalescers under one bound count their flushers apart")
	}
	c1.flushers.Store(c1.maxFlushers) // all of them running for c1's lanes
	if c2.another(&lane{flushers: 1, sending: 1, queue: make([]*queued, 64)}) {
		t.Fatal("another flusher for a second coalescer beyond the bound the first one filled")
	}
}

// A lone caller's lane stays for the next command to its server (no lane
// made and dropped per call), reset as a new one; idle lanes are bounded.
func TestCoalescerKeepsIdleLanes(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	co := testCoalescer(c)
	t.Cleanup(func() { co.close(context.Background()) })
	set := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := co.Process(ctx, redis.NewStatusCmd(ctx, "set", "k", "v")); err != nil {
			t.Fatal(err)
		}
	}
	set()
	co.mu.Lock()
	first := co.lanes[c]
	co.mu.Unlock()
	if first == nil {
		t.Fatal("no lane kept after a lone command")
	}
	set()
	co.mu.Lock()
	again, flushers := co.lanes[c], first.flushers
	co.mu.Unlock()
	if again != first || flushers != 0 {
		t.Fatalf("second command: lane %p (first %p), %d flushers; want the first lane, idle", again, first, flushers)
	}
	co.mu.Lock()
	defer co.mu.Unlock()
	first.sent = 100
	co.idle(first)
	if first.sent != 0 {
		t.Fatalf("an idle lane keeps its last batch size %d", first.sent)
	}
	for range keptLanes + 8 {
		n := redis.NewClient(&redis.Options{Addr: mr.Addr()}) // never dialled
		t.Cleanup(func() { _ = n.Close() })
		l := &lane{node: n}
		co.lanes[n] = l
		co.idle(l)
	}
	if len(co.lanes) != keptLanes {
		t.Fatalf("%d idle lanes kept, want at most %d", len(co.lanes), keptLanes)
	}
}

func TestCoalescerClosed(t *testing.T) {
	co, _ := newHeldCoalescer(t)
	co.close(context.Background())
	ctx := context.Background()
	if err := co.Process(ctx, redis.NewStatusCmd(ctx, "set", "k", "v")); !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}

// testCoalescer returns a coalescer on c, as New makes it.
func testCoalescer(c redis.UniversalClient) *coalescer {
	t, err := newTopology(c)
	if err != nil {
		panic(err)
	}
	co := newCoalescer(c, t, NewFlusherBound()) // its bound is not shared with other tests' coalescers
	return co
}

// Close that ends while a batch is in flight says so in its error, as it
// A flusher that comes back from a batch after close, with commands queued
// behind it, fails them with redis.ErrClosed and ends: it sends nothing
// more and leaves the coalescer's lock free.
func TestCoalescerFlusherEndsAfterClose(t *testing.T) {
	c, h := newHeldClient(t)
	co := testCoalescer(c)
	co.maxFlushers = 1 // the queued command waits for the one flusher
	t.Cleanup(h.unhold)
	h.hold.Store(true)
	bg := context.Background()
	first := make(chan error, 1)
	go func() { first <- co.Process(bg, redis.NewStatusCmd(bg, "set", "k0", "v")) }()
	<-h.held // the flusher's batch is in flight
	ctx, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	second := make(chan error, 1)
	go func() { second <- co.Process(ctx, redis.NewStatusCmd(ctx, "set", "k1", "v")) }()
	for i := 0; co.queuedLen() != 1; i++ { // the queue has no signal: poll it, bounded
		if i == 5000 {
			t.Fatal("the second command did not queue within 5 s")
		}
		time.Sleep(time.Millisecond)
	}
	closed, stop := context.WithCancel(bg)
	stop()
	co.close(closed) // marks the coalescer closed; does not wait
	h.unhold()
	if err := <-first; err != nil {
		t.Fatalf("the command in flight at close: %v", err)
	}
	if err := <-second; !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("the command queued at close: %v, want redis.ErrClosed", err)
	}
	wctx, wcancel := context.WithTimeout(bg, 5*time.Second)
	defer wcancel()
	if n := co.run.wait(wctx); n != 0 {
		t.Fatalf("%d flushers still running 5 s after the last batch", n)
	}
	if h.sends.Load() != 1 {
		t.Fatalf("%d sends, want only the batch in flight at close", h.sends.Load())
	}
}

// goroutineHook records, per command name, whether a command was sent on
// a goroutine running inSender: the caller's, as opposed to one of the

// cmdKey finds the first key of each command the lock calls send, so that
// the coalescer queues it for the master that serves that key.
func TestCmdKey(t *testing.T) {
	bg := context.Background()
	for _, c := range []struct {
		cmd  redis.Cmder
		want string
	}{
		{redis.NewStatusCmd(bg, "set", "k", "v", "nx", "px", 1000), "k"},
		{redis.NewCmd(bg, "evalsha", "sha", 2, "k1", "k2", "a"), "k1"},
		{redis.NewCmd(bg, "eval", "return 1", 1, "k1"), "k1"},
		{redis.NewIntCmd(bg, "msetex", "2", "k1", "v", "k2", "v", "nx", "px", "1000"), "k1"},
		{redis.NewIntCmd(bg, "delifeq", "k", "v"), "k"},
		{redis.NewCmd(bg, "ping"), ""},
	} {
		if got := cmdKey(c.cmd); got != c.want {
			t.Errorf("cmdKey(%v) = %q, want %q", c.cmd.Args(), got, c.want)
		}
	}
}

// A flusher whose batch was just answered waits until three quarters of
// the callers it expects back have queued (the flusher decides whom it
// expects: a lane's only flusher counts the batch's and those queued
// meanwhile). It waits boundedly, and not at all before its first batch.
func TestFlusherWaitsForTheCallersItAnswered(t *testing.T) {
	for _, c := range []struct {
		name                   string
		queued, expect, yields int
		want                   bool
	}{
		{"two answered, two queued, none back yet", 2, 4, 0, true},
		{"one of the two answered back", 3, 4, 1, false},
		{"one of two answered back, three queued before", 3, 5, 0, true},
		{"nobody back after the last yield", 2, 4, maxYields, false},
		{"a flusher's first look", 5, 0, 0, false},
		{"a large batch, its callers coming back", 150, 256, 2, true},
		{"three quarters of a large batch back", 192, 256, 2, false},
	} {
		if got := waitsForCallers(c.queued, c.expect, c.yields); got != c.want {
			t.Errorf("%s: waitsForCallers(%d, %d, %d) = %v, want %v", c.name, c.queued, c.expect, c.yields, got, c.want)
		}
	}
}

// gateHook reports each send of SETs (its command count) on arrived and
// holds it until the test lets one send go (proceed) or all (free).
type gateHook struct {
	arrived chan int
	proceed chan struct{}
	free    chan struct{}
}

func (h *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *gateHook) gate(cmds []redis.Cmder) {
	if cmds[0].Name() != "set" {
		return // the connection's handshake
	}
	select {
	case h.arrived <- len(cmds):
	case <-h.free:
		return
	}
	select {
	case <-h.proceed:
	case <-h.free:
	}
}

func (h *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.gate([]redis.Cmder{cmd}); return next(ctx, cmd) }
}

func (h *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.gate(cmds); return next(ctx, cmds) }
}

// Callers in a loop go out together: after a batch of two is answered, with
// two other callers queued meanwhile, the lane's only flusher waits for the
// two it answered to send their next commands and sends all four as one
// pipeline, not the two queued alone and the two answered in a round trip
// of their own.
func TestFlusherSendsTheAnsweredCallersWithTheQueued(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	h := &gateHook{arrived: make(chan int), proceed: make(chan struct{}), free: make(chan struct{})}
	c.AddHook(h)
	co := testCoalescer(c)
	co.maxFlushers = 1
	t.Cleanup(func() { co.close(context.Background()) })
	t.Cleanup(func() { close(h.free) }) // first: a failed test may have sends held
	// waitQueued waits until n commands are queued (the queue has no
	// signal: poll it, bounded), or until the test has seen the send it
	// checks (done).
	done := make(chan struct{})
	waitQueued := func(n int) bool {
		for range 5000 {
			if co.queuedLen() >= n {
				return true
			}
			select {
			case <-done:
				return false
			case <-time.After(time.Millisecond):
			}
		}
		return false
	}
	co.yield = func() { waitQueued(4) } // the answered callers come back during the wait
	ctx := context.Background()
	set := func(key string) {
		if err := co.Process(ctx, redis.NewStatusCmd(ctx, "set", key, "v")); err != nil {
			t.Error(err)
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { set("x") }) // alone, on its own goroutine
	if n := <-h.arrived; n != 1 {
		t.Fatalf("the first send holds %d commands, want 1", n)
	}
	for _, caller := range []string{"a", "b"} {
		wg.Go(func() { set(caller + "1"); set(caller + "2") })
	}
	if !waitQueued(2) {
		t.Fatal("a1 and b1 not queued after 5 s")
	}
	h.proceed <- struct{}{} // x is answered; a flusher sends a1 and b1
	if n := <-h.arrived; n != 2 {
		t.Fatalf("the second send holds %d commands, want 2 (a1, b1)", n)
	}
	for _, caller := range []string{"c", "d"} {
		wg.Go(func() { set(caller + "1") })
	}
	if !waitQueued(2) {
		t.Fatal("c1 and d1 not queued after 5 s")
	}
	h.proceed <- struct{}{} // a1 and b1 are answered; a and b send again
	if n := <-h.arrived; n != 4 {
		t.Fatalf("the third send holds %d commands, want 4 (c1, d1, a2, b2)", n)
	}
	close(done)
	h.proceed <- struct{}{}
	wg.Wait()
}

// doneCounter is a context that counts the calls of its Done method.
type doneCounter struct {
	context.Context
	calls atomic.Int32
}

func (c *doneCounter) Done() <-chan struct{} {
	c.calls.Add(1)
	return c.Context.Done()
}

// A queued caller waits on its own entry alone: it never asks its context
// for a Done channel (a select on it, and the channel a fresh context
// makes when asked, cost more client CPU than the rest of the wait). The
// watcher that would wake it at its deadline starts with the wait and
// ends once no caller waits.
func TestCoalescerWaitsWithoutTheContextsDoneChannel(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	h := &holdHook{held: make(chan struct{}, 1), release: make(chan struct{})}
	c.AddHook(h)
	co := testCoalescer(c)
	t.Cleanup(func() { co.close(context.Background()) })
	t.Cleanup(h.unhold)
	h.hold.Store(true)
	bg := context.Background()
	first := make(chan error, 1)
	go func() { first <- co.Process(bg, redis.NewStatusCmd(bg, "set", "k0", "v")) }()
	<-h.held // sent by its caller; the next one queues
	tctx, cancel := context.WithTimeout(bg, 30*time.Second)
	defer cancel()
	ctx := &doneCounter{Context: tctx}
	second := make(chan error, 1)
	go func() { second <- co.Process(ctx, redis.NewStatusCmd(ctx, "set", "k1", "v")) }()
	waitQueued(t, co.queuedLen, 1)
	co.mu.Lock()
	watching := co.watching
	co.mu.Unlock()
	if !watching {
		t.Fatal("a caller waits and no watcher runs")
	}
	h.unhold()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if n := ctx.calls.Load(); n != 0 {
		t.Fatalf("the queued caller asked its context for its Done channel %d times, want 0", n)
	}
	wctx, wcancel := context.WithTimeout(bg, 5*time.Second)
	defer wcancel()
	if n := co.watchRun.wait(wctx); n != 0 {
		t.Fatal("the watcher still runs 5 s after the last caller was answered")
	}
	co.mu.Lock()
	defer co.mu.Unlock()
	if co.watching {
		t.Fatal("the watcher has ended but is marked as running")
	}
}

// A caller queued with a deadline before the watcher's next look wakes the
// watcher, so that it looks by that deadline.
func TestCoalescerWatcherLooksByTheEarliestDeadline(t *testing.T) {
	co := &coalescer{watchNow: make(chan struct{}, 1), watching: true}
	now := time.Now()
	co.watchAt = now.Add(time.Hour)
	co.watchLocked(now.Add(2*time.Hour), true)
	co.watchLocked(time.Time{}, false)
	if !co.watchAt.Equal(now.Add(time.Hour)) || len(co.watchNow) != 0 {
		t.Fatalf("a later deadline or none moved the watcher's look to %v (woken: %d)", co.watchAt.Sub(now), len(co.watchNow))
	}
	co.watchLocked(now.Add(time.Minute), true)
	if !co.watchAt.Equal(now.Add(time.Minute)) || len(co.watchNow) != 1 {
		t.Fatalf("an earlier deadline: the watcher looks in %v (woken: %d), want in 1m0s and woken", co.watchAt.Sub(now), len(co.watchNow))
	}
}

// A caller whose command is being sent again (its first reply said it did
// not run) and whose context is cancelled stops waiting, though the
// client does not bound the re-send by the context: the watcher wakes it.
func TestCoalescerWakesACallerWhoseCommandIsSentAgain(t *testing.T) {
	f := startFakeRESP(t)
	co := fakeCoalescer(t, f, "standalone") // no ContextTimeoutEnabled
	t.Cleanup(func() { co.close(context.Background()) })
	t.Cleanup(f.releaseHeld)
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() { done <- co.Process(ctx, setNX(ctx, "tryhold", "a")) }()
	<-f.held // refused with TRYAGAIN, then sent again and held
	cancel()
	select {
	case err := <-done:
		if !IsAbandoned(err) || !errors.Is(err, context.Canceled) {
			t.Fatalf("the caller of a command sent again: %v, want an abandoned call", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the caller of a command sent again still waits 5 s after its context was cancelled")
	}
}

// Many callers whose contexts end at random moments, by deadline or by
// cancellation, while their commands are queued, in flight or answered:
// each gets its own reply or its context's error, none waits past its
// context's end by much, and a command whose caller got its context's
// error (not an abandoned call) was never sent. The client does not bound
// commands by their contexts, so every caller queues (none sends its own),
// and the server is slow: one flusher, each of its round trips 3 ms, so
// that callers leave while queued as well as in flight.
func TestCoalescerCallersLeavingAtRandom(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	c.AddHook(slowHook(3 * time.Millisecond))
	co := testCoalescer(c)
	co.maxFlushers = 1
	t.Cleanup(func() { co.close(context.Background()) })
	const workers, calls = 32, 100
	var wg sync.WaitGroup
	var dropped sync.Map // keys of SETs whose callers got their context's error
	for w := range workers {
		wg.Go(func() {
			for i := range calls {
				id := fmt.Sprintf("w%d-%d", w, i)
				var ctx context.Context
				var cancel context.CancelFunc
				switch i % 3 {
				case 0: // a short deadline
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(i%7)*100*time.Microsecond)
				case 1: // cancelled, no deadline
					ctx, cancel = context.WithCancel(context.Background())
					if i%2 == 0 {
						cancel()
					} else {
						time.AfterFunc(time.Duration(i%5)*100*time.Microsecond, cancel)
					}
				default: // a deadline it never meets
					ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
				}
				start := time.Now()
				var err error
				if i%2 == 0 {
					cmd := redis.NewStringCmd(ctx, "echo", id)
					if err = co.Process(ctx, cmd); err == nil && cmd.Val() != id {
						t.Errorf("caller %s got the reply %q", id, cmd.Val())
					}
				} else {
					cmd := redis.NewStatusCmd(ctx, "set", id, id)
					err = co.Process(ctx, cmd)
					if err != nil && !IsAbandoned(err) {
						dropped.Store(id, true)
					}
				}
				if err != nil && ctx.Err() == nil {
					t.Errorf("caller %s: %v before its context ended", id, err)
				}
				if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("caller %s: %v, want its reply or its context's error", id, err)
				}
				if d := time.Since(start); d > 10*time.Second {
					t.Errorf("caller %s returned after %v", id, d)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	// What the flushers sent has been answered by now: wait for them.
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if n := co.run.wait(wctx); n != 0 {
		t.Fatalf("%d flushers still run", n)
	}
	n := 0
	dropped.Range(func(k, _ any) bool {
		n++
		if mr.Exists(k.(string)) {
			t.Errorf("the SET of %s was sent, though its caller was told it was not", k)
		}
		return true
	})
	t.Logf("%d SETs dropped before they were sent", n)
}

// slowHook makes each send of a client take d longer: a slow server.
type slowHook time.Duration

func (h slowHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h slowHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		time.Sleep(time.Duration(h))
		return next(ctx, cmd)
	}
}

func (h slowHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		time.Sleep(time.Duration(h))
		return next(ctx, cmds)
	}
}

// A group's commands go out in order, with no other caller's command
// between them, and once: a reply that says one of them did not run
// (TRYAGAIN here) is its caller's to act on, never sent again, where a
// command alone would be; after a lost connection go-redis sends nothing
// again either. Both ways a group goes: on its caller's goroutine when
// nothing is in flight, and in a flusher's pipeline among other callers'
// commands.
func TestCoalescerSendsAGroupWholeAndOnce(t *testing.T) {
	f := startFakeRESP(t)
	co := fakeCoalescer(t, f, "standalone") // no ContextTimeoutEnabled: a caller with a deadline queues
	co.maxFlushers = 1                      // the queue waits for the one in flight
	t.Cleanup(func() { co.close(context.Background()) })
	t.Cleanup(f.releaseHeld)
	group := func(ctx context.Context, key string) []redis.Cmder {
		return []redis.Cmder{redis.NewStatusCmd(ctx, "multi"), redis.NewStatusCmd(ctx, "set", key, "v"), redis.NewCmd(ctx, "exec")}
	}

	// Alone: a context without a deadline never ends, so its caller sends.
	bg := context.Background()
	if err := co.ProcessGroup(bg, group(bg, "tryagain-alone")...); !IsTryAgain(err) {
		t.Fatalf("a group whose command was refused with TRYAGAIN: %v", err)
	}
	if n := f.count("set tryagain-alone v"); n != 1 {
		t.Fatalf("the refused command of a group sent alone was sent %d times, want 1", n)
	}
	if err := co.ProcessGroup(bg, group(bg, "cut-alone")...); !IsAmbiguous(err) {
		t.Fatalf("a group whose connection was cut: %v, want an ambiguous error", err)
	}
	if n := f.count("set cut-alone v"); n != 1 {
		t.Fatalf("a group sent alone whose connection was cut was sent %d times, want once", n)
	}

	// A flusher's: a caller with a deadline queues (the client does not
	// bound commands by it).
	ctx := testCtx(t)
	if err := co.ProcessGroup(ctx, group(ctx, "cut-queued")...); !IsAmbiguous(err) {
		t.Fatalf("a queued group whose connection was cut: %v, want an ambiguous error", err)
	}
	if n := f.count("set cut-queued v"); n != 1 {
		t.Fatalf("a queued group whose connection was cut was sent %d times, want once", n)
	}

	// Among others: one command is in flight, held by the server; the
	// others and the group queue behind it and go in one pipeline.
	held := make(chan error, 1)
	go func() { held <- co.Process(ctx, redis.NewStatusCmd(ctx, "set", "hold", "v")) }()
	<-f.held
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			if err := co.Process(ctx, redis.NewStatusCmd(ctx, "set", fmt.Sprintf("k%d", i), "v")); err != nil {
				t.Error(err)
			}
		})
	}
	for i := 0; co.queuedLen() < 4; i++ {
		if i == 5000 {
			t.Fatal("4 callers not queued after 5 s")
		}
		time.Sleep(time.Millisecond) // the queue has no signal: poll it, bounded
	}
	g := group(ctx, "tryagain-queued")
	grouped := make(chan error, 1)
	go func() { grouped <- co.ProcessGroup(ctx, g...) }()
	for i := range 4 {
		wg.Go(func() {
			for j := 0; co.queuedLen() < 5; j++ { // behind the group
				if j == 5000 {
					t.Error("the group not queued after 5 s")
					return
				}
				time.Sleep(time.Millisecond)
			}
			if err := co.Process(ctx, redis.NewStatusCmd(ctx, "set", fmt.Sprintf("k%d", 4+i), "v")); err != nil {
				t.Error(err)
			}
		})
	}
	for i := 0; co.queuedLen() < 9; i++ {
		if i == 5000 {
			t.Fatal("9 callers not queued after 5 s")
		}
		time.Sleep(time.Millisecond)
	}
	f.releaseHeld()
	wg.Wait()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if err := <-grouped; !IsTryAgain(err) {
		t.Fatalf("a queued group whose command was refused with TRYAGAIN: %v", err)
	}
	if n := f.count("set tryagain-queued v"); n != 1 {
		t.Errorf("the refused command of a queued group was sent %d times, want 1", n)
	}
	f.mu.Lock()
	log := slices.Clone(f.log)
	f.mu.Unlock()
	i := slices.Index(log, "set tryagain-queued v")
	if i < 1 || i+1 >= len(log) || log[i-1] != "multi" || log[i+1] != "exec" {
		t.Errorf("the group's commands did not go together: %q", log)
	}
	for k := range 8 {
		if f.count(fmt.Sprintf("set k%d v", k)) != 1 {
			t.Errorf("k%d sent %d times, want 1", k, f.count(fmt.Sprintf("set k%d v", k)))
		}
	}
}
