package manager

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/metrics"
	"github.com/shardlock/shardlock/sharding"
)

// Client is the go-redis client a Manager runs on: a *redis.Client
// (standalone, or Sentinel failover with redis.NewFailoverClient) or a
// *redis.ClusterClient. New rejects any other kind.
type Client = redis.UniversalClient

var (
	_ Client = (*redis.Client)(nil)
	_ Client = (*redis.ClusterClient)(nil)
)

// Manager takes and keeps distributed locks on one Redis deployment. It is
// safe for concurrent use. It owns one background goroutine, the watchdog
// scheduler, which Close stops.
type Manager struct {
	client Client
	cmd    commander  // the coalescer in front of client, or client behind once
	co     *coalescer // nil when coalescing is off
	renew  Client
	cfg    config
	log    *zap.Logger
	sched  *scheduler
	topo   *topology // which servers the client talks to

	// The clients bound every command by its context's deadline (see
	// direct): cmd's and client's.
	cmdBounds, clientBounds bool
	io                      inflight // goroutines carrying exchanges whose callers may have gone
	closed                  atomic.Bool
	closing                 chan struct{} // closed by Close: wakes the waiters
	closeOnce               sync.Once
	defaultAC               acquireConfig // the configuration of an acquire without options
	notify                  *notifier     // nil with notifications off
	queues                  localQueues
	mx                      *metrics.Metrics
	unregister              func() // removes this manager's held locks from mx
}

// New returns a Manager on client. Unless WithStartupCheck(0) is given it
// checks, within 5 s, that every master runs Redis 7.0 or later and loads
// the Lua scripts on each.
//
// It returns an *InvalidArgumentError for a nil client or contradicting
// options, a *ServerVersionError for a server that is too old, and the
// Redis error when the servers cannot be reached.
func New(client Client, opts ...Option) (*Manager, error) {
	if isNil(client) { // nil, or a nil pointer of any client type
		return nil, invalid("client", "nil")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	topo, err := newTopology(client)
	if err != nil {
		return nil, err
	}
	m := &Manager{client: client, topo: topo, cmd: client, renew: client, cfg: cfg, log: cfg.logger, closing: make(chan struct{})}
	m.defaultAC = m.defaultAcquireConfig()
	m.mx = cfg.metrics
	if cfg.renewClient != nil {
		m.renew = cfg.renewClient
	}
	if cfg.startupCheck > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.startupCheck)
		err := m.startupCheck(ctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("shardlock: startup check: %w", err)
		}
	}
	m.cmd = newOnce(client)
	if cfg.autoPipeline == nil || *cfg.autoPipeline {
		m.co = newCoalescer(client, topo)
		m.cmd = m.co
	}
	m.cmdBounds, m.clientBounds = honoursDeadlines(m.cmd), honoursDeadlines(client)
	m.queues = localQueues{queues: map[string]*localQueue{}, max: cfg.maxWaiters}
	if cfg.notifications {
		m.notify = newNotifier(m)
	}
	m.sched = newScheduler(m)
	m.unregister = m.mx.AddHeldSource(m.sched.eachHeld)
	return m, nil
}

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

// TryAcquire makes one attempt to take the lock on resource.
//
// It returns ErrNotAcquired when another owner holds it, an
// *InvalidArgumentError for bad input (before any round trip), ErrClosed
// after Close, a *ReplicaAckError under WithReplicaAck(…, ReplicaFail), or
// the Redis error.
func (m *Manager) TryAcquire(ctx context.Context, resource string, opts ...AcquireOption) (*Lock, error) {
	return m.acquire(ctx, resource, opts, false)
}

// Acquire takes the lock on resource, waiting while another owner holds it,
// with the retry strategy, until the wait limit (default 30 s) or until ctx
// ends. Transient Redis errors (a failover, a migrating slot) are retried the
// same way.
//
// When the wait ends without the lock it returns an error that matches
// ErrNotAcquired, and also ctx's error when ctx ended it, or the error of
// the last attempt when Redis failed. Otherwise it returns what TryAcquire
// returns.
//
// Every acquire returns by ctx's deadline (and Acquire by its wait limit)
// whatever the client's timeouts and options; an attempt whose reply comes
// later is released as soon as it comes. With ctx already ended it sends
// nothing.
func (m *Manager) Acquire(ctx context.Context, resource string, opts ...AcquireOption) (*Lock, error) {
	return m.acquire(ctx, resource, opts, true)
}

// transientRetry bounds the wait after an attempt that failed for a
// transient reason (a failover, a migrating slot).
const transientRetry = 100 * time.Millisecond

// An acquire attempt's status: the acquire scripts' (scripts.AcquireHeld,
// AcquireSet, AcquireOurs), which the plain SET NX paths give too.
const (
	attemptContended = int(scripts.AcquireHeld) // someone else holds the key
	attemptFresh     = int(scripts.AcquireSet)  // this attempt set the key
	attemptReplay    = int(scripts.AcquireOurs) // the key already held our token: an earlier attempt (or a re-send) set it
)

func (m *Manager) acquire(ctx context.Context, resource string, opts []AcquireOption, wait bool) (*Lock, error) {
	if err := m.usable(); err != nil {
		return nil, err
	}
	ac, key, err := m.acquireConfig(resource, opts)
	if err != nil {
		m.mx.Class(metrics.ClassDefault).AcquireFailed(0, metrics.ReasonInvalid)
		return nil, err
	}
	return m.acquireMeasured(ctx, target{resource: resource, key: key}, &ac, wait)
}

// acquireMeasured resolves the metrics class of tg, runs the acquire loop
// and records its outcome.
func (m *Manager) acquireMeasured(ctx context.Context, tg target, ac *acquireConfig, wait bool) (*Lock, error) {
	m.resolveClass(ac, tg.resource)
	start := time.Now()
	l, err := m.acquireLoop(ctx, tg, ac, wait, start)
	if ac.cls != nil {
		if err == nil {
			ac.cls.Acquired(time.Since(start))
		} else {
			ac.cls.AcquireFailed(time.Since(start), acquireReason(err, wait))
		}
	}
	return l, err
}

// resolveClass sets ac.cls, the metrics class of an acquire of resource.
func (m *Manager) resolveClass(ac *acquireConfig, resource string) {
	if m.mx == nil {
		return
	}
	name := ac.class
	if name == "" && m.cfg.classFunc != nil {
		name = m.cfg.classFunc(resource)
	}
	ac.cls = m.mx.Class(name)
}

// nextWait returns how long to wait before retry n (1-based), bounded by
// waitUntil, or false when the strategy or the wait limit says stop.
func nextWait(retry RetryStrategy, n int, waitUntil time.Time) (time.Duration, bool) {
	d := retry.NextBackoff(n)
	remaining := time.Until(waitUntil)
	if d < 0 || remaining <= 0 {
		return 0, false
	}
	return min(d, remaining), true
}

// resetTimer arms *t for d, making it on first use.
func resetTimer(t **time.Timer, d time.Duration) {
	if *t == nil {
		*t = time.NewTimer(d)
		return
	}
	(*t).Reset(d)
}

// acquireReason is the metrics reason of an acquire's error.
func acquireReason(err error, wait bool) string {
	switch {
	case errors.Is(err, ErrInvalidArgument):
		return metrics.ReasonInvalid
	case errors.Is(err, ErrClosed):
		return metrics.ReasonClosed
	case errors.Is(err, ErrReplicaAck):
		return metrics.ReasonReplicaAck
	case errors.Is(err, ErrTooManyWaiters):
		return metrics.ReasonTooManyWaiters
	case errors.Is(err, context.Canceled):
		return metrics.ReasonCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return metrics.ReasonTimeout
	case errors.Is(err, ErrNotAcquired) && wait:
		return metrics.ReasonTimeout
	case errors.Is(err, ErrNotAcquired):
		return metrics.ReasonContended
	}
	return metrics.ReasonRedisError
}

// target is what an acquire locks: one resource, or a batch in one slot.
type target struct {
	resource, key string     // the first (or only) resource and its key
	batch         *batchInfo // nil for a single lock
}

// orphan hands a token that may hold the target's keys to the reaper.
func (m *Manager) orphan(tg target, token string, deadline time.Time) {
	if tg.batch == nil {
		m.reap(tg.key, token, deadline)
		return
	}
	for _, k := range tg.batch.keys {
		m.reap(k, token, deadline)
	}
}

// reap hands a token that may hold key, until deadline, to the watchdog's
// reaper; after Close, when no reaper runs, it releases it once now
// (bounded by a second), best effort.
func (m *Manager) reap(key, token string, deadline time.Time) {
	if m.sched.addOrphan(key, token, deadline) {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), minTime(deadline, time.Now().Add(time.Second)))
	defer cancel()
	_ = m.runScript(ctx, m.client, scripts.Release, []string{key}, token).Err()
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// attemptResult is what one acquire attempt learned.
type attemptResult struct {
	status   int // attemptContended, attemptFresh or attemptReplay
	replicas int
	fence    uint64
	fences   []uint64 // a batch's
	held     []int    // a contended batch's: indices of the keys others hold (1-based)
	claimed  bool     // handed over on the claim lease (see fair.go)
}

// attemptArgs is one acquire attempt: a fair waiter's (fw set), a single
// lock's or a batch's.
type attemptArgs struct {
	tg                  target
	token               string
	tokenArg            any
	ac                  *acquireConfig
	fw                  *fairWaiter
	sendAt              time.Time
	firstTry, queueNext bool // single lock: see attempt
	first, mark         bool // batch: see attemptBatch
}

// send makes one acquire attempt, bounded by ctx and deadline (see
// bounded). An attempt whose caller stopped waiting is settled when its
// reply comes: a token that may hold the keys goes to the reaper at once.
func (m *Manager) send(ctx context.Context, deadline time.Time, a attemptArgs) (attemptResult, error) {
	if err := ctx.Err(); err != nil {
		return attemptResult{}, err
	}
	bounds := m.cmdBounds
	if m.cfg.replicas > 0 {
		bounds = m.clientBounds // the write and its WAIT go through the client
	}
	if direct(ctx, deadline, bounds) {
		return m.attemptSettled(ctx, &a)
	}
	b := a // captured by the exchange's goroutine; a stays on the stack
	return exchangeOn(m, bounds, ctx, deadline, func(ctx context.Context) (attemptResult, error) {
		return m.attemptSettled(ctx, &b)
	}, func(res attemptResult, err error) {
		// The caller has gone: whatever the attempt may hold is released,
		// unless Redis said the key is someone else's or attemptSettled
		// already handed it over.
		if (err == nil && res.status != attemptContended) || (err != nil && !isAbandoned(err)) {
			m.orphan(b.tg, b.token, b.sendAt.Add(b.ac.ttl))
		}
	})
}

// attemptSettled is attemptOnce that hands the token to the reaper when the
// attempt was sent but its reply did not come in time (the coalescer's
// abandoned call): the server may still run it and take the key.
func (m *Manager) attemptSettled(ctx context.Context, a *attemptArgs) (attemptResult, error) {
	res, err := m.attemptOnce(ctx, a)
	if isAbandoned(err) {
		m.orphan(a.tg, a.token, a.sendAt.Add(a.ac.ttl))
	}
	return res, err
}

// attemptOnce makes the attempt a describes.
func (m *Manager) attemptOnce(ctx context.Context, a *attemptArgs) (res attemptResult, err error) {
	switch {
	case a.fw != nil:
		res.status, res.fence, err = m.attemptQueued(ctx, a.tg.key, a.fw, a.ac)
	case a.tg.batch == nil:
		res.status, res.fence, res.replicas, err = m.attempt(ctx, a.tg.key, a.token, a.tokenArg, a.ac, a.firstTry, a.queueNext)
	default:
		res.status, res.fences, res.held, res.replicas, err = m.attemptBatch(ctx, a.tg.batch, a.token, a.ac, a.first, a.mark)
	}
	return res, err
}

// attempt makes one acquire attempt: one round trip, or two for a contended
// first try that must tell a replay apart.
//
// A first try (firstTry) sends SET NX PX, whose "OK" is the uncontended
// path's whole cost. A nil reply means another token holds the key, or
// ours does: go-redis re-sends a command whose reply was lost, so a SET
// that ran may answer nil. Unless the caller queues next (queueNext: the
// queue script tells a replay apart), a GET finds out. Later tries send
// SET NX PX GET, which answers both in one reply.
func (m *Manager) attempt(ctx context.Context, key, token string, tokenArg any, ac *acquireConfig, firstTry, queueNext bool) (status int, fence uint64, replicas int, err error) {
	ttlMs := ac.ttlMs
	if m.cfg.replicas > 0 {
		return m.attemptWait(ctx, key, token, ttlMs, ac)
	}
	if ac.fencing {
		res, err := scripts.AcquireFenced.Run(ctx, m.cmd, []string{key, sharding.FenceKey(key)}, token, ttlMs).Slice()
		status, fence, err := parseFenced(res, err)
		return status, fence, 0, err
	}
	// A command whose reply did not come in time belongs to the coalescer:
	// its error is all there is to read.
	if !firstTry {
		cmd := redis.NewStringCmd(ctx, "set", key, tokenArg, "px", ttlMs, "nx", "get")
		if err := m.cmd.Process(ctx, cmd); isAbandoned(err) {
			return 0, 0, 0, err
		}
		status, err = parseSetNXGet(cmd, token)
		return status, 0, 0, err
	}
	set := redis.NewStatusCmd(ctx, "set", key, tokenArg, "px", ttlMs, "nx")
	if err := m.cmd.Process(ctx, set); isAbandoned(err) {
		return 0, 0, 0, err
	}
	switch err := set.Err(); {
	case err == nil:
		return attemptFresh, 0, 0, nil
	case !errors.Is(err, redis.Nil):
		return 0, 0, 0, err
	case queueNext:
		return attemptContended, 0, 0, nil
	}
	get := redis.NewStringCmd(ctx, "get", key)
	if err := m.cmd.Process(ctx, get); isAbandoned(err) {
		return 0, 0, 0, err
	}
	status, err = parseGet(get, token)
	return status, 0, 0, err
}

// parseGet reads the GET after a SET NX that answered nil: our token (with
// or without the queued mark) means the SET ran after all.
func parseGet(cmd *redis.StringCmd, token string) (int, error) {
	v, err := cmd.Result()
	switch {
	case errors.Is(err, redis.Nil):
		return attemptContended, nil // gone since: not ours
	case isWrongType(err):
		return attemptContended, nil // a key of another type: someone else's
	case err != nil:
		return 0, err
	case isOurs(v, token):
		return attemptReplay, nil
	}
	return attemptContended, nil
}

// isOurs reports whether a lock key's value v is token, with or without
// QueuedMark.
func isOurs(v, token string) bool {
	return v == token || (len(v) == len(token)+1 && v[len(token):] == QueuedMark && v[:len(token)] == token)
}

// attemptWait writes the key and sends WAIT in one pipeline on the owning
// master, so WAIT counts the replicas that have this write.
func (m *Manager) attemptWait(ctx context.Context, key, token string, ttlMs any, ac *acquireConfig) (status int, fence uint64, replicas int, err error) {
	fencing := ac.fencing
	node, err := m.topo.masterFor(ctx, key)
	if err != nil {
		return 0, 0, 0, err
	}
	pipe := node.Pipeline()
	var (
		set   *redis.StringCmd
		fcmd  *redis.Cmd
		waitc *redis.Cmd
	)
	if fencing {
		fcmd = scripts.AcquireFenced.Eval(ctx, pipe, []string{key, sharding.FenceKey(key)}, token, ttlMs)
	} else {
		set = redis.NewStringCmd(ctx, "set", key, token, "px", ttlMs, "nx", "get")
		_ = pipe.Process(ctx, set)
	}
	waitc = pipe.Do(ctx, "wait", m.cfg.replicas, m.cfg.replicaTimeout.Milliseconds())
	_, _ = pipe.Exec(ctx)
	if fencing {
		status, fence, err = parseFenced(fcmd.Slice())
	} else {
		status, err = parseSetNXGet(set, token)
	}
	if err != nil {
		return 0, 0, 0, err
	}
	if status == attemptContended {
		return status, fence, 0, nil // nothing was written: no WAIT to read
	}
	return status, fence, m.replicaCount(waitc, "acquire"), nil
}

// replicaCount reads the WAIT sent after a write that succeeded (an
// acquire or an extend, named by op). The one rule for a WAIT that fails
// (an error reply, a connection lost after the write's reply): it counts
// as no replica acknowledging, it is logged at WARN, and the replica policy
// decides, as for any count below WithReplicaAck's.
func (m *Manager) replicaCount(wait *redis.Cmd, op string) int {
	n, err := wait.Int64()
	if err != nil {
		m.log.Warn("WAIT failed after "+op+"; counted as no replica acknowledging",
			zap.String("event", "replica_ack_failed"), zap.Error(err))
		return 0
	}
	return int(n)
}

func parseSetNXGet(cmd *redis.StringCmd, token string) (int, error) {
	old, err := cmd.Result()
	switch {
	case errors.Is(err, redis.Nil):
		return attemptFresh, nil
	case isWrongType(err):
		return attemptContended, nil // a key of another type: someone else's, left alone
	case err != nil:
		return 0, err
	case isOurs(old, token):
		return attemptReplay, nil
	}
	return attemptContended, nil
}

func parseFenced(res []any, err error) (int, uint64, error) {
	if err != nil {
		return 0, 0, err
	}
	if len(res) != 2 {
		return 0, 0, fmt.Errorf("shardlock: unexpected acquire reply %v", res)
	}
	st, _ := res[0].(int64)
	f, _ := res[1].(int64)
	return int(st), uint64(f), nil
}

// Do takes the lock on resource (as Acquire), runs fn with a context that is
// cancelled when the lock is lost or reaches its max hold (or when ctx
// ends), releases the lock and returns fn's error. If the lock was lost
// meanwhile, the error also matches ErrLockLost. If fn panics, Do releases
// the lock and the panic goes on.
func (m *Manager) Do(ctx context.Context, resource string, fn func(ctx context.Context) error, opts ...AcquireOption) error {
	if err := m.usable(); err != nil {
		return err
	}
	if fn == nil {
		return invalid("fn", "nil")
	}
	l, err := m.Acquire(ctx, resource, opts...)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	lctx := l.Context()
	stop := context.AfterFunc(lctx, func() { cancel(context.Cause(lctx)) })
	// Release even if ctx has ended, but not for longer than the lock can
	// live; and release when fn panics too, before the panic goes on.
	release := func() error {
		stop()
		cancel(nil)
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), l.ttlNow())
		defer rcancel()
		return l.Release(rctx)
	}
	panicked := true
	defer func() {
		if panicked {
			_ = release()
		}
	}()
	ferr := fn(fctx)
	panicked = false
	rerr := release()
	if errors.Is(rerr, ErrLockLost) {
		return errors.Join(ferr, ErrLockLost)
	}
	if rerr != nil {
		return errors.Join(ferr, rerr)
	}
	return ferr
}

// Close stops the watchdog, releases every lock this Manager still holds
// (best effort, bounded by ctx; their Done channels close), and waits for
// the Manager's goroutines. With ctx already ended it still makes one try,
// bounded by a second. It returns an error that says how many locks it
// could not release, and how many exchanges with Redis were still without
// a reply when ctx ended (they end by the client's own timeouts). Calls
// made after Close return ErrClosed; a second Close returns ErrClosed.
func (m *Manager) Close(ctx context.Context) error {
	if err := m.usable(); err != nil {
		return err
	}
	if ctx == nil {
		return invalid("context", "nil")
	}
	err := ErrClosed
	m.closeOnce.Do(func() {
		m.closed.Store(true)
		close(m.closing)
		m.sched.stop()
		m.unregister()
		if ctx.Err() != nil {
			// Try once even so, bounded: the keys would otherwise stay
			// until their TTL.
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), closeGrace)
			defer cancel()
		}
		// Renewals and releases in flight end first (their tokens may
		// come back as orphans), for a moment at most.
		wctx, wcancel := context.WithTimeout(ctx, closeGrace)
		m.io.wait(wctx)
		wcancel()
		locks, orphans := m.sched.take()
		err = m.releaseAll(ctx, locks, orphans)
		if m.notify != nil {
			m.notify.close()
		}
		if m.co != nil {
			m.co.close(ctx)
		}
		if n := m.io.wait(ctx); n > 0 {
			err = errors.Join(err, fmt.Errorf("shardlock: close: %d exchanges with Redis still without a reply; they end by the client's timeouts", n))
		}
	})
	return err
}

// closeGrace bounds Close's wait for exchanges in flight, and its one try
// at releasing when its context has already ended.
const closeGrace = time.Second

// releaseAll releases what Close found held: locks and orphaned tokens.
func (m *Manager) releaseAll(ctx context.Context, locks []*Lock, orphans []orphan) error {
	if failed, err := m.releaseLocks(ctx, locks, orphans, time.Time{}); failed > 0 {
		return fmt.Errorf("shardlock: close: %d locks not released: %w", failed, err)
	}
	return nil
}

// releaseLocks releases locks (single or batch) and orphaned tokens with one
// pipeline per node, retrying transient failures until ctx ends or deadline
// (zero: none). Each lock's outcome is recorded on it, as its Release
// would; locks already released or lost are left alone. It returns how
// many locks and tokens it could not release and the error that stopped it;
// their tokens go to the orphan reaper.
func (m *Manager) releaseLocks(ctx context.Context, locks []*Lock, orphans []orphan, deadline time.Time) (failed int, err error) {
	type item struct {
		key, token string // an orphaned token
		lock       *Lock
		ambiguous  bool // an earlier try's reply was lost
	}
	items := make([]item, 0, len(locks)+len(orphans))
	for _, l := range locks {
		if l.beginRelease() {
			items = append(items, item{lock: l})
		}
	}
	for _, o := range orphans {
		items = append(items, item{key: o.key, token: o.token})
	}
	err = m.retryTransient(ctx, deadline, func(ctx context.Context) error {
		calls := make([]scriptCall, len(items))
		sentAt := time.Now()
		for i, it := range items {
			switch l := it.lock; {
			case l == nil:
				calls[i] = scriptCall{script: scripts.Release, keys: []string{it.key}, args: []any{it.token}}
			case l.multi != nil:
				calls[i] = scriptCall{script: scripts.ReleaseBatch, keys: l.multi.keys, args: l.args[:]}
			default:
				calls[i] = scriptCall{script: scripts.Release, keys: l.keys[:], args: l.args[:]}
			}
		}
		if err := m.bounded(ctx, time.Time{}, func(ctx context.Context) error {
			runBatch(ctx, m.client, calls)
			return nil
		}, nil); err != nil {
			// No reply in time (calls belongs to the exchange now): all
			// are left, their outcomes unknown.
			for i := range items {
				items[i].ambiguous = true
			}
			return err
		}
		var (
			rest     []item
			firstErr error
		)
		for i, c := range calls {
			it := items[i]
			err := c.cmd.Err()
			if err != nil && isTransient(err) {
				it.ambiguous = it.ambiguous || isAmbiguous(err)
				rest = append(rest, it)
				firstErr = err
				continue
			}
			l := it.lock
			if l == nil {
				continue
			}
			var result error
			switch {
			case err != nil:
				result = fmt.Errorf("shardlock: release: %w", err)
			case l.multi != nil:
				res, err := c.cmd.Int64Slice()
				if result = err; err == nil {
					result = l.batchReleaseResult(res, it.ambiguous, sentAt, l.validUntilNow())
				}
			default:
				r, _, err := parseRelease(c.cmd.Result())
				result = releaseResult(r, err, it.ambiguous, sentAt, l.validUntilNow())
			}
			l.finishRelease(result)
		}
		items = rest
		return firstErr
	})
	for _, it := range items {
		failed++
		if l := it.lock; l != nil {
			for _, k := range l.scriptKeys() {
				m.sched.addOrphan(k, l.token, l.validUntilNow())
			}
			l.finishRelease(fmt.Errorf("shardlock: release: %w", err))
		}
	}
	return failed, err
}

// releaseResult turns a release script reply into Release's error.
// ambiguous says an earlier try of the same release may have run: then a
// key found gone before the lock's validity ran out was deleted by us.
//
// r is release.lua's code: 1, 2 and 3 released (deleted or handed over), 0
// gone, -1 held by another token. After a lost reply, while the lock was
// valid, a key found gone or held by another token was released (or handed
// over) by the earlier try.
func releaseResult(r int64, err error, ambiguous bool, sentAt, validUntil time.Time) error {
	if err != nil {
		return fmt.Errorf("shardlock: release: %w", err)
	}
	switch {
	case r == scripts.Done || r == scripts.HandedOver || r == scripts.HandedToNext:
		return nil
	case ambiguous && sentAt.Before(validUntil):
		return nil
	case r == scripts.Gone:
		return ErrExpired
	}
	return ErrNotHeld
}

// parseRelease reads release.lua's reply: a status, or {HandedToNext,
// fence}.
func parseRelease(res any, err error) (code int64, fence uint64, _ error) {
	if err != nil {
		return 0, 0, err
	}
	switch v := res.(type) {
	case int64:
		return v, 0, nil
	case []any:
		if len(v) == 2 {
			c, _ := v[0].(int64)
			f, _ := v[1].(int64)
			return c, uint64(f), nil
		}
	}
	return 0, 0, fmt.Errorf("shardlock: unexpected release reply %v", res)
}

func (m *Manager) fields(ctx context.Context, event string, l *Lock, extra ...zap.Field) []zap.Field {
	f := append(make([]zap.Field, 0, 8+len(extra)),
		zap.String("event", event),
		zap.String("resource", l.resource),
		zap.String("owner", m.cfg.owner),
		zap.String("token", redactToken(l.token)),
		zap.Duration("ttl", l.ttl),
	)
	if l.fence != 0 {
		f = append(f, zap.Uint64("fence", l.fence))
	}
	if id := m.traceID(ctx); id != "" {
		f = append(f, zap.String("trace_id", id))
	}
	return append(f, extra...)
}

// traceID reads ctx's trace id with WithTraceID's function. A function
// that panics gives no id: a log line must never panic a lock call, which
// may hold a lock by then.
func (m *Manager) traceID(ctx context.Context) (id string) {
	if m.cfg.traceID == nil || ctx == nil {
		return ""
	}
	defer func() {
		if recover() != nil {
			id = ""
		}
	}()
	return m.cfg.traceID(ctx)
}
