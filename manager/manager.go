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

	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/metrics"
)

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

	closed     atomic.Bool
	closing    chan struct{} // closed by Close: wakes the waiters
	closeOnce  sync.Once
	defaultAC  acquireConfig // the configuration of an acquire without options
	notify     *notifier     // nil with notifications off
	queues     localQueues
	mx         *metrics.Metrics
	unregister func() // removes this manager's held locks from mx
}

// New returns a Manager on client: a *redis.Client (standalone, or
// Sentinel failover with redis.NewFailoverClient) or a *redis.ClusterClient;
// it rejects any other kind. Unless WithStartupCheck(false) is given it
// checks that every master runs Redis 7.0 or later and loads the Lua
// scripts on each, by ctx's deadline (DefaultStartup when ctx has none). A
// server that is loading its data (LOADING) or a cluster that is down or
// failing over (CLUSTERDOWN, TRYAGAIN, MASTERDOWN, READONLY) is waited out
// until then.
//
// It returns an *InvalidArgumentError for a nil client or context, another
// kind of client or contradicting options, a *ServerVersionError for a
// server that is too old, and the Redis error (or ctx's, or both) when the
// servers cannot be reached, or do not get ready, in time.
func New(ctx context.Context, client redis.UniversalClient, opts ...Option) (*Manager, error) {
	if ctx == nil {
		return nil, invalid("context", "nil")
	}
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
	tr, err := transport.New(client, transport.Config{Coalesce: cfg.autoPipeline == nil || *cfg.autoPipeline, Flushers: processFlushers})
	if err != nil {
		return nil, invalid("client", "%v", err)
	}
	m := &Manager{tr: tr, client: client, cmd: tr.Cmd(), renew: client, cfg: cfg, log: cfg.logger, closing: make(chan struct{})}
	m.defaultAC = m.defaultAcquireConfig()
	m.mx = cfg.metrics
	if cfg.renewClient != nil {
		m.renew = cfg.renewClient
	}
	if cfg.startupCheck {
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if _, ok := ctx.Deadline(); !ok {
			cctx, cancel = context.WithTimeout(ctx, DefaultStartup)
		}
		err := m.startupCheck(cctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("shardlock: startup check: %w", err)
		}
	}
	m.queues = localQueues{queues: map[string]*localQueue{}, max: cfg.maxWaiters}
	if cfg.notifications {
		m.notify = newNotifier(m)
	}
	m.sched = newScheduler(m)
	m.unregister = m.mx.AddHeldSource(m.sched.eachHeld)
	return m, nil
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
// and every key an attempt whose caller stopped waiting may have taken
// (best effort, bounded by ctx; the locks' Done channels close), and waits
// for the Manager's goroutines. Commands already on their way to Redis get
// their replies first, for a second at most, so that such an attempt is
// released after it has run. With ctx already ended it still makes one try,
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
		// Renewals, releases and coalesced batches in flight end first,
		// for a moment at most: their tokens may come back as orphans,
		// and an orphan's release must come after the attempt that may
		// have taken its key, or that attempt takes the key for its TTL.
		wctx, wcancel := context.WithTimeout(ctx, closeGrace)
		m.tr.Settle(wctx)
		wcancel()
		locks, orphans := m.sched.take()
		err = m.releaseAll(ctx, locks, orphans)
		if m.notify != nil {
			m.notify.close()
		}
		if n := m.tr.Close(ctx); n > 0 {
			err = errors.Join(err, fmt.Errorf("shardlock: close: %d exchanges with Redis still without a reply; they end by the client's timeouts", n))
		}
		m.bg.Wait()
	})
	return err
}

// closeGrace bounds Close's wait for exchanges in flight, and its one try
// at releasing when its context has already ended.
const closeGrace = time.Second

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
