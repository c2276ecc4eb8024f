package manager

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
)

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
	tr, err := transport.New(client, transport.Config{Coalesce: cfg.coalescing == nil || *cfg.coalescing, Flushers: processFlushers})
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
		m.notify = newNotifier(m.tr, m.log, cfg.owner, m.queues.lookNow, m.queues.announced)
	}
	m.sched = newScheduler(m.log, m.defaultAC.interval)
	go m.runWatchdog()
	m.unregister = m.mx.AddHeldSource(m.sched.eachHeld)
	return m, nil
}

// minServer is the oldest Redis shardlock supports: SET ... NX GET needs
// 6.2, and 7.0 is the oldest release still maintained that has sharded
// pub/sub and the cluster behaviour we test against.
const minServer = "7.0.0"

// startupCheck checks that every master is new enough and preloads the
// scripts on every master. A reply that says "not now" (a server loading
// its data, a cluster that is down or failing over: see isNotNow) makes it
// look again (retryWhile's backoff, the slot map reloaded) until ctx ends;
// then it returns that reply with ctx's error.
func (m *Manager) startupCheck(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err // nothing sent
	}
	return m.tr.RetryWhile(ctx, time.Time{}, transport.IsNotNow, m.startupCheckOnce)
}

// startupCheckOnce makes the startup check's commands once.
func (m *Manager) startupCheckOnce(ctx context.Context) error {
	var (
		mu    sync.Mutex
		found = allServerCmds
	)
	check := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "server").Result()
		if transport.IsReply(err) {
			return nil // a server that does not say its version (an emulator); nothing to check
		}
		if err != nil {
			return err
		}
		v := infoField(info, "redis_version")
		if v != "" && versionLess(v, minServer) {
			return &ServerVersionError{Addr: c.Options().Addr, Version: v, Need: minServer}
		}
		s, err := m.masterCmds(ctx, c)
		if err != nil {
			return err
		}
		mu.Lock()
		found = found.and(s)
		mu.Unlock()
		return nil
	}
	if err := m.tr.EachMaster(ctx, check); err != nil {
		return err
	}
	m.found = found
	m.setServerCmds(found)
	for _, s := range scripts.All() {
		if err := s.Load(ctx, m.tr.Client()).Err(); err != nil {
			return err
		}
	}
	return nil
}

func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// versionLess compares dotted versions numerically.
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}
