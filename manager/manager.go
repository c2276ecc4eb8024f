package manager

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/metrics"
)

// This file declares the engine's state: the Manager, the Lock, and what
// the Manager keeps for its rooms (the local queues, the watchdog's
// schedule, the orphaned tokens). What they do lives in the rooms' files,
// which call downward only: see "The engine's rooms" in docs/design.md.

// Manager takes and keeps distributed locks on one Redis deployment. It is
// safe for concurrent use. It owns one background goroutine, the watchdog
// scheduler, which Close stops.
type Manager struct {
	tr     *transport.Transport
	client redis.UniversalClient // tr.Client()
	cmd    transport.Commander   // tr.Cmd(): the coalescer in front of client, or client behind once
	renew  redis.UniversalClient
	cfg    config
	log    *zap.Logger
	sched  *scheduler
	bg     sync.WaitGroup // Observe's goroutines: they end with m.closing, and Close waits for them

	closed atomic.Bool
	// conditional: every master runs SET ... IFEQ and DELIFEQ or DELEX
	// ... IFEQ, and WithConditionalCommands is not off (see
	// kindExclusiveNative); delex: the conditional delete is DELEX, not
	// DELIFEQ (condDel).
	conditional atomic.Bool
	delex       atomic.Bool
	// msetex: every master runs MSETEX with NX and PX, and
	// WithConditionalCommands is not off (see kindBatchNative); msetexTx:
	// it goes in a transaction (serverCmds).
	msetex     atomic.Bool
	msetexTx   atomic.Bool
	found      serverCmds    // what New found every master runs
	closing    chan struct{} // closed by Close: wakes the waiters
	closeOnce  sync.Once
	defaultAC  acquireConfig // the configuration of an acquire without options
	notify     *notifier     // nil with notifications off
	queues     localQueues
	mx         *metrics.Metrics
	unregister func() // removes this manager's held locks from mx
}

// processFlushers bounds the coalescers' pipelines in flight over every
// Manager of the process: the bound comes from the process's CPUs, so
// several managers keep as many in flight as one would, in larger batches.
var processFlushers = transport.NewFlusherBound()

// errNoManager is what a method of a nil *Manager, or of a Manager not made
// by New, returns.
var errNoManager = invalid("manager", "nil or not made by New")

// usable returns errNoManager for a nil or zero Manager, else nil.
func (m *Manager) usable() error {
	if m == nil || m.sched == nil {
		return errNoManager
	}
	return nil
}

// open is usable for the calls that go to Redis: after Close they return
// ErrClosed without a round trip.
func (m *Manager) open() error {
	if err := m.usable(); err != nil {
		return err
	}
	if m.closed.Load() {
		return ErrClosed
	}
	return nil
}

const (
	stateHeld = iota
	stateReleasing
	stateReleased
	stateLost
)

// Lock is a held lock, returned by the Manager. Its methods are safe for
// concurrent use; on a nil *Lock, or a zero Lock not made by a Manager,
// they return ErrNilLock (or zero values, and a closed Done) instead of
// panicking, so `defer lock.Release(ctx)` after a failed acquire is
// harmless.
type Lock struct {
	m          *Manager
	resource   string
	key        string
	token      string
	fence      uint64
	acquiredAt time.Time
	keys       [1]string      // {key}, for script calls without allocating a slice
	args       [1]any         // {token}, boxed once, likewise
	cls        *metrics.Class // nil without metrics
	kind       lockKind       // what the lock's calls are (kind.go)
	batch      *batchInfo     // a batch lock's resources, keys and fences; nil for one resource
	// viaQueue: the lock came through Redis's queue (a fair waiter's
	// attempt, or a hand-over), so its key most likely carries the queued
	// mark that a compare-and-delete of the bare token does not match.
	viaQueue bool
	// handed: the lock was handed over from Redis's queue, so its key
	// holds its token with the queued mark (what the native hand-over
	// needs to know: handover_native.go).
	handed bool

	mu sync.Mutex
	// sig is made on first use of Context or Done: most holders never ask.
	sig        *lockSignals
	cause      error // why Context is (or is to be) cancelled; nil while it lives
	ttl        time.Duration
	validUntil mono  // by this process's monotonic clock
	err        error // why Done closed; after a release, see releaseErrLocked
	replicas   int
	state      uint8
	finished   bool // Done is (or is to be) closed

	w *watch // the watchdog's entry (renewal.go), allocated with the Lock
}

// lockSignals are the channels a holder may wait on.
type lockSignals struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// localQueues makes the waiters of one resource in this process queue up,
// so that only one of them at a time contends in Redis.
type localQueues struct {
	mu     sync.Mutex
	queues map[string]*localQueue
	max    int          // waiters per resource at most; 0: no limit
	active atomic.Int64 // len(queues), read without the lock by busy

	// Keys this process saw contended lately (its release handed one to a
	// queued waiter): a waiting Acquire of one goes straight to the queue
	// script, which takes a free key too, instead of trying SET NX first.
	hmu    sync.Mutex
	hints  map[string]time.Time // when it was seen contended
	nhints atomic.Int64         // len(hints), read without the lock
	// qlives: how long the queues of keys this process's native joins
	// extended live at least (handover_native.go), under hmu.
	qlives map[string]time.Time
}

// localQueue is the waiters of one resource in this process (queue.go).
type localQueue struct {
	turn    chan struct{} // holds the token while no waiter contends
	members int

	// The fair queue, under localQueues.mu.
	head   *fairWaiter // the waiter whose turn it is, in fair mode
	holder *Lock       // a lock on the key that a waiter of this queue took, while held
	streak int         // hand-overs in a row to this process's own waiters
}

// orphan is a token that may hold a key without anyone knowing: an acquire
// attempt whose reply never came, or a release that could not be
// confirmed. The scheduler releases it until deadline (when the key's TTL
// would have run out anyway).
type orphan struct {
	key, token string
	kind       lockKind // the kind of one key of the lock: it says how to release it
	deadline   time.Time
	next       time.Time
	tries      int
}

// scheduler is the watchdog's schedule (schedule.go; the loop that works
// it, the Manager's one background goroutine, is in watchdog.go). It keeps
// every held lock in a heap by the time it must next look at it: to renew
// it (every TTL/3 by default, pipelined with every other lock due in the
// same tick), to fire its max hold, or to declare it lost when its
// validity runs out with no successful renewal; and the orphaned tokens
// the reaper releases (reaper.go).
type scheduler struct {
	log *zap.Logger

	mu       sync.Mutex
	locks    lockHeap
	incoming []*Lock // new locks, not yet in the heap (see add)
	inFlight []*Lock // taken out of the heap by collect, until process ends
	orphans  []orphan
	stopped  bool
	taken    bool // Close has taken the orphans (see addOrphan)
	// sleepUntil is when the loop will next wake by itself, by timer: an
	// earlier due time moves the timer (wakeByLocked), a later one need
	// not. Zero while the loop is awake (it collects again before it
	// sleeps).
	sleepUntil mono
	timer      *time.Timer   // the loop's, set to sleepUntil under mu
	idle       time.Duration // how long the loop sleeps with nothing to do

	wake   chan struct{}   // wakes the loop now (poke)
	ctx    context.Context // cancelled by stop: ends the loop and any batch in flight
	cancel context.CancelFunc
	exited chan struct{}
}

// lockHeap orders locks by due time.
type lockHeap []*Lock
