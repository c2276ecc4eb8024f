package manager

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/sharding"
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
	if !errors.Is(err, context.DeadlineExceeded) || isAbandoned(err) {
		t.Fatalf("queued command: %v, want the context's error, not an abandoned call", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("returned after %v", d)
	}
	if err := <-inFlight; !isAbandoned(err) || !errors.Is(err, context.DeadlineExceeded) {
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
	if err := <-inFlight; !isAbandoned(err) {
		t.Fatalf("in-flight command: %v, want an abandoned call", err)
	}
	qCancel()
	if err := <-queuedErr; !errors.Is(err, context.Canceled) || isAbandoned(err) {
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

// The bound on pipelines in flight is the process's (it comes from the
// process's CPUs): several managers in one process share it, so that
// together they keep as many in flight as one would, in larger batches.
// (How one coalescer applies the bound: the test above.)
func TestCoalescersShareTheProcessBound(t *testing.T) {
	m1, _ := newMiniManager(t)
	m2, _ := newMiniManager(t)
	c1, c2 := m1.co, m2.co
	if c1.flushers != &processFlushers || c2.flushers != &processFlushers {
		t.Fatal("the managers' coalescers count their flushers apart from the process's")
	}
	shared := new(atomic.Int32)
	c1.flushers, c2.flushers = shared, shared
	shared.Store(c1.maxFlushers) // all of them running for c1's lanes
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
	co := newCoalescer(c, t)
	co.flushers = new(atomic.Int32) // its bound is not shared with other tests' coalescers
	return co
}

// Close that ends while a batch is in flight says so in its error, as it
// does for any exchange still without a reply: the flusher outlives Close
// until the batch ends.
func TestCloseCountsBatchInFlight(t *testing.T) {
	c, h := newHeldClient(t)
	m, err := New(context.Background(), c, WithStartupCheck(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.unhold)
	h.hold.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- m.co.Process(ctx, redis.NewStatusCmd(ctx, "set", "k", "v")) }()
	<-h.held // the flusher sent the batch and waits for its reply
	cancel()
	if err := <-errc; !isAbandoned(err) {
		t.Fatalf("the caller that left: %v, want an abandoned command", err)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer ccancel()
	err = m.Close(cctx)
	if err == nil || !strings.Contains(err.Error(), "1 exchanges with Redis still without a reply") {
		t.Fatalf("Close with a batch in flight: %v, want it counted", err)
	}
	h.unhold()
	if n := m.co.run.wait(context.Background()); n != 0 {
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

// waited reports whether someone waits in f.wait.
func (f *inflight) waited() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.zero != nil
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
			if m.co.run.waited() {
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
	if !m.sched.addOrphan("shardlock:{k}", "tok", rwNone, deadline) {
		t.Fatal("a token handed over after the watchdog stopped, before Close took the list, was refused")
	}
	if _, orphans := m.sched.take(); len(orphans) != 1 || orphans[0].token != "tok" {
		t.Fatalf("Close took %v, want the token handed over after stop", orphans)
	}
	if m.sched.addOrphan("shardlock:{k}", "tok2", rwNone, deadline) {
		t.Fatal("a token handed over after Close took the list was accepted: nothing would release it")
	}
}

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
					for i := 0; m.co.lanesBusy(); i++ {
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
		h.inFlight = append(h.inFlight, h.m.Load().io.n.Load())
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
	for i := 0; m.io.n.Load() != 0; i++ {
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
func (co *coalescer) lanesBusy() bool {
	co.mu.Lock()
	defer co.mu.Unlock()
	for _, l := range co.lanes {
		if l.flushers > 0 {
			return true
		}
	}
	return false
}
