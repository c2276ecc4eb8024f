package transport

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	_ Commander = (*coalescer)(nil)
	_ Commander = (*once)(nil)
)

// coalescer sends concurrent callers' commands as pipelines, one lane per
// server: the client's one server (a standalone or Sentinel-managed
// client), or each master of a cluster, found by the slot of the command's
// first key. Each caller queues its command and waits for its own reply,
// until its context ends. A lane's flusher goroutine sends what is queued
// as one pipeline of at most coalesceBatch commands, waits for its
// replies, and goes on while the lane has commands queued; the commands
// queued meanwhile go together in the next one. A lane has a few flushers
// when its queue grows behind those in flight (see laneFlushers), and none
// when it has nothing queued.
//
// A waiting caller blocks on its entry's channel alone, not on its
// context's Done channel as well: a select on both, and the Done channel
// that each call's fresh context makes for it, cost more client CPU than
// the rest of the hand-off. The coalescer's watcher wakes the callers
// whose contexts end instead (see watch): at their deadlines, and within
// watchEvery of a cancellation.
//
// Every command goes out exactly once (see noRetry): go-redis's pipelines
// re-send answered commands, so they never get the chance. A reply that
// says a command did not run (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, LOADING,
// MASTERDOWN, READONLY) makes the coalescer send that command again, alone:
// through the cluster client, which follows the redirect (ASK with
// ASKING), after a short pause for a "not now". After a connection error,
// only the commands whose replies were not read carry the error, and they
// are the only ones whose outcome is unknown. A command whose caller
// stopped waiting before it was sent is never sent; one already sent is
// answered into the void (what it did is settled by the caller's reaper).
//
// A group (ProcessGroup: a transaction's MULTI, its commands and EXEC) is
// one entry of its lane's queue: its commands go together and in order in
// one pipeline, and none is sent again, whatever its reply.
//
// It replaces go-redis's AutoPipeline(), which re-sends answered commands
// and waits for a batch however the caller's context ends.
type coalescer struct {
	scripter                      // c, the client; its script commands go through Process
	cc       *redis.ClusterClient // nil for one server
	one      *redis.Client        // the one server's client, nil for a cluster

	own bool // callers may send on their own goroutines: the client bounds a command by its context's deadline

	mu          sync.Mutex
	lanes       map[*redis.Client]*lane
	flushers    *atomic.Int32 // running, over every coalescer that shares its FlusherBound
	maxFlushers int32
	closed      bool

	run inflight // flushers and re-sends

	yield func() // how a flusher waits for callers: runtime.Gosched; a test's signal

	// The watcher (see watch): running while callers wait; when it looks
	// next (a time no waiting caller's deadline is before); what wakes it
	// early; and its goroutine, which close waits for.
	watching bool
	watchAt  time.Time
	watchNow chan struct{}
	watchRun inflight
	resends  map[*queued]struct{} // commands being sent again, their callers waiting
}

// lane is one server's queue.
type lane struct {
	node     *redis.Client
	queue    []*queued
	flights  [][]*queued // the batches in flight, their callers waiting
	flushers int         // running
	sending  int         // flushers with a batch in flight
	sent     int         // the size of the batch sent last
}

const (
	// coalesceBatch bounds a pipeline.
	coalesceBatch = 256
	// laneFlushers bounds a lane's pipelines in flight; another one
	// starts when at least moreFlushersAt commands, and at least as many
	// as the lane's last batch held, wait behind those in flight (every
	// running flusher has its batch in flight), while fewer than
	// flushersPerCPU x GOMAXPROCS are in flight over all the lanes of
	// every coalescer that shares its FlusherBound (see another). A
	// few pipelines in flight keep both the server and the client busy;
	// more make smaller batches, which cost the server more per command.
	laneFlushers   = 8
	moreFlushersAt = 4
	flushersPerCPU = 2
	// After a batch is answered, its callers are about to send their next
	// commands: the flusher yields up to maxYields times while fewer than
	// three quarters of the callers it expects (the batch's and, for a
	// lane's only flusher, those queued when it was answered) have
	// queued, so that the next batch carries them all rather than the
	// first ones alone (see waitsForCallers).
	maxYields = 4
	// keptLanes bounds the idle lanes kept for their servers' next
	// commands (a cluster's masters; a server that left the cluster keeps
	// its lane only while the map has room).
	keptLanes = 64
	// maxResends bounds how often a command is sent again after replies
	// that say it did not run; resendPause is the first pause after a
	// "not now", doubled each time up to resendPauseMax.
	maxResends     = 64
	resendPause    = time.Millisecond
	resendPauseMax = 64 * time.Millisecond
	// watchEvery bounds how long the watcher sleeps while callers wait:
	// how late a caller whose context is cancelled before its deadline
	// may learn it while its command waits for a flusher or a reply. (It
	// wakes the callers whose deadlines pass at those deadlines.)
	watchEvery = 2 * time.Millisecond
	// watchStep is the watcher's shortest sleep: a context's own timer
	// may end it a moment after its deadline.
	watchStep = 50 * time.Microsecond
)

// queued command states
//
// A caller waits for one value on its entry's channel, sent by whoever
// moves the entry out of queuedWaiting or queuedSent: a flusher that
// answers it (queuedAnswered) or finds its context ended before sending
// it (queuedDropped), or the watcher when its context ends (queuedDropped
// before it was sent, queuedLeft after).
const (
	queuedWaiting  int32 = iota // in the queue
	queuedSent                  // taken by a flusher
	queuedDropped               // its caller left before it was sent
	queuedLeft                  // its caller left after it was sent
	queuedAnswered              // its reply is in its command
)

type queued struct {
	ctx   context.Context // the caller's: bounds a re-send
	cmd   redis.Cmder
	once  noRetry       // cmd as sent: &once is a redis.Cmder without an allocation of its own
	group []redis.Cmder // a group's commands (see ProcessGroup), cmd the last; nil for one command
	state atomic.Int32
	done  chan struct{} // one value when the caller's wait ends (see the states); buffered, so it never blocks
}

// queuedPool keeps the queued commands whose callers have taken their
// answer: a command's entry and its channel are made once and serve many
// commands. An entry whose caller left before the answer is never put
// back (the flusher may still hold it, and its answer may still come).
var queuedPool = sync.Pool{New: func() any { return &queued{done: make(chan struct{}, 1)} }}

func newQueued(ctx context.Context, cmd redis.Cmder) *queued {
	q := queuedPool.Get().(*queued)
	q.ctx, q.cmd, q.once = ctx, cmd, noRetry{cmd}
	return q
}

// answer hands q's caller its reply, unless the caller has left.
func (q *queued) answer() {
	if q.state.CompareAndSwap(queuedSent, queuedAnswered) {
		q.done <- struct{}{}
	}
}

// end ends the wait of q's caller, whose context has ended: before its
// command was sent (queuedDropped: it never will be) or after
// (queuedLeft). It reports false when the wait has ended already.
func (q *queued) end() bool {
	if q.state.CompareAndSwap(queuedWaiting, queuedDropped) || q.state.CompareAndSwap(queuedSent, queuedLeft) {
		q.done <- struct{}{}
		return true
	}
	return false
}

// recycle puts q back in the pool once its caller has taken the answer:
// nothing else refers to it then.
func (q *queued) recycle() {
	q.ctx, q.cmd, q.once, q.group = nil, nil, noRetry{}, nil
	q.state.Store(queuedWaiting)
	queuedPool.Put(q)
}

// FlusherBound bounds the flushers running over the lanes of every
// coalescer that shares it. The engine hands one bound to every manager of
// a process: the bound comes from the process's CPUs, so several managers
// in one process keep as many pipelines in flight as one would, in larger
// batches.
type FlusherBound struct {
	running atomic.Int32
	max     int32
}

// NewFlusherBound returns a bound of flushersPerCPU x GOMAXPROCS flushers.
func NewFlusherBound() *FlusherBound {
	return &FlusherBound{max: int32(flushersPerCPU * runtime.GOMAXPROCS(0))}
}

// newCoalescer returns a coalescer for client c of topology t, under bound b.
func newCoalescer(c redis.UniversalClient, t *topology, b *FlusherBound) *coalescer {
	co := &coalescer{lanes: map[*redis.Client]*lane{}, flushers: &b.running,
		maxFlushers: b.max, own: honoursDeadlines(c), cc: t.cc, one: t.one, yield: runtime.Gosched,
		watchNow: make(chan struct{}, 1)}
	co.scripter = scripter{c: c, process: co.Process}
	return co
}

// Process queues cmd and waits for its reply or ctx's end (its deadline;
// a cancellation within watchEvery). It returns
// cmd's error; ctx's error when cmd was not sent (nothing about it is
// ambiguous); an *abandonedError when cmd was sent but ctx ended first
// (then cmd belongs to the coalescer: do not read it). When nothing is in
// flight to cmd's server, and ctx has a deadline the client bounds a
// command by (ContextTimeoutEnabled) or ctx never ends, the caller sends
// cmd itself: one goroutine hop less for a lone caller.
func (co *coalescer) Process(ctx context.Context, cmd redis.Cmder) error {
	return co.process(ctx, cmd, nil, cmdKey(cmd))
}

// ProcessGroup sends cmds as a group (see Commander) and returns the
// first error among their replies, ctx's error when they were not sent,
// or an *abandonedError when they were sent and ctx ended first (then
// they belong to the coalescer: do not read them).
func (co *coalescer) ProcessGroup(ctx context.Context, cmds ...redis.Cmder) error {
	if len(cmds) == 0 {
		return nil
	}
	if err := co.process(ctx, cmds[len(cmds)-1], cmds, groupKey(cmds)); IsAbandoned(err) {
		return err
	}
	return groupErr(cmds)
}

// process is Process of cmd, or of group (whose last command is cmd), to
// the master that serves key.
func (co *coalescer) process(ctx context.Context, cmd redis.Cmder, group []redis.Cmder, key string) error {
	if err := ctx.Err(); err != nil {
		cmd.SetErr(err)
		return err
	}
	node := co.one
	if node == nil {
		n, err := co.cc.MasterForKey(ctx, key)
		if err != nil {
			cmd.SetErr(err)
			return err
		}
		node = n
	}
	co.mu.Lock()
	if co.closed {
		co.mu.Unlock()
		cmd.SetErr(redis.ErrClosed)
		return redis.ErrClosed
	}
	l := co.lanes[node]
	if l == nil {
		l = &lane{node: node}
		co.lanes[node] = l
	}
	deadline, bounded := ctx.Deadline()
	if l.flushers == 0 && (co.own && bounded || ctx.Done() == nil) {
		// Nothing in flight here. A context that never ends
		// (context.Background, say) needs no bound from the client: a
		// flusher would wait for the reply as long.
		return co.sendLoneLocked(ctx, l, cmd, group)
	}
	q := newQueued(ctx, cmd)
	q.group = group
	l.queue = append(l.queue, q)
	if co.another(l) {
		co.startFlusherLocked(l)
	}
	co.watchLocked(deadline, bounded)
	co.mu.Unlock()
	return q.wait(ctx)
}

// sendLoneLocked sends cmd, or group (whose last command is cmd), on its
// caller's goroutine, as lane l's flusher of one, and hands the commands
// queued meanwhile to a flusher of their own. co.mu must be held; it is
// released.
func (co *coalescer) sendLoneLocked(ctx context.Context, l *lane, cmd redis.Cmder, group []redis.Cmder) error {
	l.flushers++
	l.sending++
	co.flushers.Add(1)
	co.mu.Unlock()
	var err error
	if group != nil {
		err = sendGroup(ctx, l.node, group)
	} else {
		err = co.sendOwn(ctx, l.node, cmd)
	}
	co.mu.Lock()
	co.flushers.Add(-1)
	l.sending--
	l.flushers--
	if co.closed {
		co.failQueueLocked(l) // no flusher starts after close
	}
	if len(l.queue) > 0 {
		co.startFlusherLocked(l)
	} else if l.flushers == 0 {
		co.idle(l)
	}
	co.mu.Unlock()
	return err
}

// startFlusherLocked starts a flusher for lane l. co.mu must be held.
func (co *coalescer) startFlusherLocked(l *lane) {
	l.flushers++
	co.flushers.Add(1)
	co.run.goFn(func() { co.flusher(l) })
}

// wait waits for the end of q's wait (see the queued states) and returns
// its command's error, ctx's error when the command was never sent, or an
// *abandonedError when it was sent and ctx ended first.
func (q *queued) wait(ctx context.Context) error {
	cmd := q.cmd
	<-q.done
	switch q.state.Load() {
	case queuedAnswered:
		q.recycle()
		return cmd.Err()
	case queuedDropped:
		// Never sent: the flusher skips it. It stays in the queue until
		// a flusher passes it, so it is never recycled. (Only a caller
		// whose context has ended is dropped.)
		err := ctx.Err()
		cmd.SetErr(err)
		return err
	}
	// Left after it was sent: its answer may still come, to nobody. The
	// entry is never recycled.
	return &abandonedError{cause: ctx.Err()}
}

// watchLocked makes sure the watcher looks at a caller queued with ctx's
// deadline (bounded: ctx has one) by that deadline: it starts the watcher
// or wakes it early. co.mu must be held.
func (co *coalescer) watchLocked(deadline time.Time, bounded bool) {
	switch {
	case !co.watching:
		co.watching = true
		co.watchAt = time.Now().Add(watchEvery)
		if bounded && deadline.Before(co.watchAt) {
			co.watchAt = deadline
		}
		co.watchRun.goFn(co.watch)
	case bounded && deadline.Before(co.watchAt):
		co.watchAt = deadline
		select {
		case co.watchNow <- struct{}{}:
		default:
		}
	}
}

// watch ends the waits of the callers whose contexts end, while any
// caller waits: it sleeps until the earliest deadline of those waiting,
// or watchEvery at most (for cancellations), then wakes every caller whose
// context has ended. It ends when no caller waits.
func (co *coalescer) watch() {
	co.mu.Lock()
	t := time.NewTimer(time.Until(co.watchAt))
	co.mu.Unlock()
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-co.watchNow:
		}
		co.mu.Lock()
		now := time.Now()
		next, waiting := co.endWaitsLocked()
		if !waiting {
			co.watching = false
			co.mu.Unlock()
			return
		}
		at := now.Add(watchEvery)
		if !next.IsZero() && next.Before(at) {
			at = next
			if step := now.Add(watchStep); at.Before(step) {
				at = step
			}
		}
		co.watchAt = at
		co.mu.Unlock()
		t.Reset(at.Sub(now))
	}
}

// endWaitsLocked ends the waits of the callers whose contexts have ended
// (see queued.end), and returns the earliest deadline of the callers still
// waiting (zero when none has one) and whether any does. co.mu must be
// held.
func (co *coalescer) endWaitsLocked() (next time.Time, waiting bool) {
	look := func(q *queued) {
		switch s := q.state.Load(); {
		case s != queuedWaiting && s != queuedSent:
			return
		case q.ctx.Err() != nil && q.end():
			return
		}
		waiting = true
		if d, ok := q.ctx.Deadline(); ok && (next.IsZero() || d.Before(next)) {
			next = d
		}
	}
	for _, l := range co.lanes {
		for _, q := range l.queue {
			look(q)
		}
		for _, b := range l.flights {
			for _, q := range b {
				look(q)
			}
		}
	}
	for q := range co.resends {
		look(q)
	}
	return next, waiting
}

// another reports whether lane l, with its queue as it is now, takes one
// more flusher: when none runs; or when every one that runs has a batch in
// flight, fewer than laneFlushers run (and fewer than maxFlushers over all
// lanes of the coalescers that share co.flushers: a bound that coalescers
// reaching it at the same moment may each pass by one), and at least
// moreFlushersAt commands, and as many as the lane's last batch held, wait.
// A flusher between two batches takes the queue itself: another one would
// split it into two smaller batches, which cost the server more per
// command.
func (co *coalescer) another(l *lane) bool {
	return l.flushers == 0 || (l.sending == l.flushers && l.flushers < laneFlushers && co.flushers.Load() < co.maxFlushers &&
		len(l.queue) >= max(moreFlushersAt, l.sent))
}

// idle settles lane l, whose last flusher has ended with nothing queued:
// the lane stays in the map for the next command to its server (no new lane
// for each lone caller) while the map holds at most keptLanes lanes, and
// starts its next burst as a new lane would.
func (co *coalescer) idle(l *lane) {
	l.sent = 0
	if len(co.lanes) > keptLanes {
		delete(co.lanes, l.node)
	}
}

// flusher sends l's queue, a batch at a time, until it is empty; then it
// ends, and the next command for its server starts a new one (see idle).
func (co *coalescer) flusher(l *lane) {
	last, yields := 0, 0 // the size of the batch this flusher sent last; yields since
	expect := 0          // the callers expected in the queue after the last batch
	inFlight := false    // counted in l.sending
	for {
		co.mu.Lock()
		if inFlight {
			l.sending--
			inFlight = false
		}
		if last > 0 {
			l.sent = last
		}
		if yields == 0 { // the first look after a batch (or none)
			expect = last
			if last > 0 && l.flushers == 1 {
				expect += len(l.queue)
			}
		}
		if waitsForCallers(len(l.queue), expect, yields) && !co.closed {
			co.mu.Unlock() // let the callers just answered queue again
			co.yield()
			yields++
			continue
		}
		yields = 0
		if co.closed {
			co.failQueueLocked(l) // nothing is sent after close
		}
		if len(l.queue) == 0 {
			co.flushers.Add(-1)
			if l.flushers--; l.flushers == 0 {
				co.idle(l)
			}
			co.mu.Unlock()
			return
		}
		n := min(len(l.queue), coalesceBatch)
		batch := make([]*queued, 0, n)
		for _, q := range l.queue[:n] {
			if q.ctx.Err() != nil {
				q.end() // never sent
			} else if q.state.CompareAndSwap(queuedWaiting, queuedSent) {
				batch = append(batch, q)
			}
		}
		rest := copy(l.queue, l.queue[n:])
		clear(l.queue[rest:])
		l.queue = l.queue[:rest]
		if len(batch) > 0 {
			l.sending++
			inFlight = true
			l.flights = append(l.flights, batch)
		}
		co.mu.Unlock()
		if len(batch) > 0 {
			co.sendBatch(l, batch)
		}
		last = len(batch)
	}
}

// waitsForCallers reports whether a flusher whose batch was just answered
// yields once more before it sends the lane's queue: while fewer than three
// quarters of the callers it expects have queued, yields times so far. It
// expects the callers of the batch (a service's goroutines send their next
// command soon after a reply) and, when it is the lane's only flusher,
// those queued meanwhile. Counting only the batch's callers, a lone
// flusher would send the queue as soon as it held as many: with a few
// callers in a loop, the batches then alternate between two parts of them,
// each a round trip of its own, which costs both sides more per command.
// Beside other flushers, it does not wait for the queued: another flusher
// coming back takes them, and waiting would only leave the server idle.
func waitsForCallers(queued, expect, yields int) bool {
	return 4*queued < 3*expect && yields < maxYields
}

// failQueueLocked fails l's queued commands with redis.ErrClosed (none of
// them was sent). co.mu must be held.
func (co *coalescer) failQueueLocked(l *lane) {
	for _, q := range l.queue {
		if q.state.CompareAndSwap(queuedWaiting, queuedSent) {
			q.cmd.SetErr(redis.ErrClosed)
			q.answer()
		}
	}
	l.queue = nil
}

// sendBatch sends batch, one of l.flights, to l's server as one pipeline (a
// lone command as itself) and hands each caller its reply, or sends again
// the commands whose replies say they did not run.
func (co *coalescer) sendBatch(l *lane, batch []*queued) {
	node := l.node
	bg := context.Background() // a batch is not any one caller's
	if len(batch) == 1 && batch[0].group == nil {
		_ = node.Process(bg, &batch[0].once)
	} else {
		pipe := node.Pipeline()
		for _, q := range batch {
			if q.group == nil {
				_ = pipe.Process(bg, &q.once)
				continue
			}
			for _, c := range q.group {
				_ = pipe.Process(bg, noRetry{c})
			}
		}
		if _, err := pipe.Exec(bg); err != nil && !IsReply(err) {
			for _, q := range batch {
				unstamp(q.cmd)
				for _, c := range q.group {
					unstamp(c)
				}
			}
		}
	}
	// The batch leaves l.flights before its callers are answered: an
	// answered caller's entry goes back to queuedPool, where the watcher
	// must not find it.
	var again []*queued // in batch order; rare: the commands whose replies say they did not run
	for _, q := range batch {
		if q.group == nil && co.sendsAgain(q.ctx, q.cmd.Err()) {
			again = append(again, q)
		}
	}
	co.mu.Lock()
	for i, b := range l.flights {
		if &b[0] == &batch[0] {
			last := len(l.flights) - 1
			l.flights[i] = l.flights[last]
			l.flights[last] = nil
			l.flights = l.flights[:last]
			break
		}
	}
	if len(again) > 0 && co.resends == nil {
		co.resends = map[*queued]struct{}{}
	}
	for _, q := range again {
		co.resends[q] = struct{}{}
	}
	co.mu.Unlock()
	for _, q := range batch {
		if len(again) > 0 && again[0] == q {
			again = again[1:]
			co.run.goFn(func() { co.resend(q) })
		} else {
			q.answer()
		}
	}
}

// resend sends q's command again, alone, until a reply says it ran, or
// until its caller leaves (the command then did not run: nothing about it
// is ambiguous, though its caller settles it as if it were).
func (co *coalescer) resend(q *queued) {
	co.sendAgain(q.ctx, q.cmd, func() bool { return q.state.Load() == queuedSent })
	co.mu.Lock()
	delete(co.resends, q) // before the answer: see sendBatch
	co.mu.Unlock()
	q.answer()
}

// sendAgain sends cmd, whose last reply said it did not run, again until a
// reply says it ran, ctx ends or wanted says no (a bounded number of
// times). A cluster client routes it and follows redirects; a "not now"
// first waits a little.
func (co *coalescer) sendAgain(ctx context.Context, cmd redis.Cmder, wanted func() bool) {
	pause := resendPause
	for range maxResends {
		if IsTryAgain(cmd.Err()) && fallsBackOnTryAgain(ctx) {
			return // its caller has another way (see WithTryAgainFallback)
		}
		if IsNotNow(cmd.Err()) {
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			pause = min(2*pause, resendPauseMax)
		}
		if !wanted() || co.isClosed() {
			return
		}
		cmd.SetErr(nil)
		if co.cc != nil {
			_ = co.cc.Process(ctx, noRetry{cmd})
		} else {
			_ = co.one.Process(ctx, noRetry{cmd})
		}
		if err := cmd.Err(); !co.again(err) {
			return
		} else if co.cc != nil && needsReload(err) {
			co.cc.ReloadState(context.Background())
		}
	}
}

// sendOwn sends cmd on its caller's goroutine, bounded by ctx's deadline
// (the client honours it), sending it again where its reply says it did
// not run, and returns its error.
func (co *coalescer) sendOwn(ctx context.Context, node *redis.Client, cmd redis.Cmder) error {
	_ = node.Process(ctx, noRetry{cmd})
	err := cmd.Err()
	if co.sendsAgain(ctx, err) {
		co.sendAgain(ctx, cmd, func() bool { return true })
		err = cmd.Err()
	}
	return err
}

// resendable reports whether a command whose send ended with err is to be
// sent again (see again), and asks a cluster client to reload its slot map
// where err says it has changed or a node is unreachable.
func (co *coalescer) resendable(err error) bool {
	if err == nil {
		return false
	}
	closed := co.cc != nil && errors.Is(err, redis.ErrClosed)
	if co.cc != nil && (needsReload(err) || closed || (err != nil && !IsReply(err) && !errors.Is(err, redis.Nil))) {
		co.cc.ReloadState(context.Background()) // lazy: go-redis reloads once, in the background
	}
	return co.again(err) || closed
}

// sendsAgain reports whether a command of ctx whose send ended with err is
// to be sent again (resendable), unless it is a TRYAGAIN its caller takes
// another way (WithTryAgainFallback).
func (co *coalescer) sendsAgain(ctx context.Context, err error) bool {
	return co.resendable(err) && !(IsTryAgain(err) && fallsBackOnTryAgain(ctx))
}

func (co *coalescer) isClosed() bool {
	co.mu.Lock()
	defer co.mu.Unlock()
	return co.closed
}

// again reports whether err, the outcome of a send, says the command did
// not run and is to be sent again: "not now" (see IsNotNow), or on a
// cluster a redirect. (A command sent to the client of a node that has
// left the cluster fails with redis.ErrClosed, unsent: send treats that
// as a redirect too.)
func (co *coalescer) again(err error) bool {
	return IsNotNow(err) || (co.cc != nil && IsRedirect(err))
}

// needsReload reports whether err says the cluster's slot map has changed.
func needsReload(err error) bool {
	if !IsReply(err) {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "CLUSTERDOWN") || strings.HasPrefix(msg, "READONLY")
}

// close makes commands queued from now on fail with redis.ErrClosed, and
// waits until ctx ends for the flushers and re-sends. It returns how many
// were still running then: each has a batch or a command in flight, and
// ends with it, by the client's timeouts when the server does not answer.
// Queued commands not yet sent fail with redis.ErrClosed.
func (co *coalescer) close(ctx context.Context) int {
	co.mu.Lock()
	co.closed = true
	co.mu.Unlock()
	n := co.run.wait(ctx)
	// The watcher ends once no caller waits: at once when no flusher or
	// re-send runs.
	select {
	case co.watchNow <- struct{}{}:
	default:
	}
	co.watchRun.wait(ctx)
	return n
}

// queuedLen returns how many commands wait in the lanes' queues.
func (co *coalescer) queuedLen() int {
	co.mu.Lock()
	defer co.mu.Unlock()
	n := 0
	for _, l := range co.lanes {
		n += len(l.queue)
	}
	return n
}

// honoursDeadlines reports whether every command c sends is bounded by its
// context's deadline: the coalescer, or a *redis.Client or
// *redis.ClusterClient with ContextTimeoutEnabled (directly or behind
// once).
func honoursDeadlines(c any) bool {
	switch c := c.(type) {
	case *coalescer:
		return true
	case *once:
		return honoursDeadlines(c.c)
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}
