package manager

import (
	"context"
	"fmt"
	"os"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/shardlock/shardlock/metrics"
	"github.com/shardlock/shardlock/sharding"
)

// Bounds on input, checked before any round trip.
const (
	MaxResourceLen = 1024 // bytes
	MaxOwnerLen    = 256  // bytes
	MinTTL         = 10 * time.Millisecond
	MaxTTL         = 24 * time.Hour
	MaxWait        = 24 * time.Hour // the longest wait limit Acquire accepts
	// MinRenewInterval is the shortest renew interval WithRenewInterval accepts.
	MinRenewInterval = 5 * time.Millisecond
)

// Defaults.
const (
	DefaultTTL     = 10 * time.Second
	DefaultWait    = 30 * time.Second
	DefaultStartup = 5 * time.Second
)

// ReplicaPolicy says what a too-small WAIT count does to an acquire or an
// Extend. A WAIT that fails (an error reply, a connection lost after the
// write's reply) counts as no replica acknowledging, and is logged at WARN.
type ReplicaPolicy int

const (
	// ReplicaFail fails the acquire with a *ReplicaAckError and releases the key.
	ReplicaFail ReplicaPolicy = iota
	// ReplicaReport keeps the lock and reports the count in Lock.Replicas.
	ReplicaReport
)

type config struct {
	prefix         string
	ttl            time.Duration
	owner          string
	logger         *zap.Logger
	retry          RetryStrategy
	retrySet       bool // retry is not DefaultRetry()
	wait           time.Duration
	watchdog       bool
	renewInterval  time.Duration // 0: ttl/3
	maxHold        time.Duration // 0: none
	renewClient    redis.UniversalClient
	fencing        bool
	replicas       int
	replicaTimeout time.Duration
	replicaPolicy  ReplicaPolicy
	coalescing     *bool // WithCoalescing; nil: on
	conditional    *bool // WithConditionalCommands; nil: on
	startupCheck   bool
	traceID        func(context.Context) string
	metrics        *metrics.Metrics
	classFunc      func(resource string) string
	notifications  bool
	maxWaiters     int
}

func defaultConfig() config {
	owner := "unknown"
	if h, err := os.Hostname(); err == nil && h != "" {
		owner = h
	}
	return config{
		prefix:        sharding.DefaultPrefix,
		ttl:           DefaultTTL,
		owner:         fmt.Sprintf("%s:%d", owner, os.Getpid()),
		logger:        zap.NewNop(),
		retry:         DefaultRetry(),
		wait:          DefaultWait,
		watchdog:      true,
		startupCheck:  true,
		notifications: true,
	}
}

// Option configures a Manager.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithKeyPrefix sets the prefix of every lock key. It must not contain '{'
// or '}'. The default is "shardlock:".
func WithKeyPrefix(p string) Option { return optionFunc(func(c *config) { c.prefix = p }) }

// Setting is an option that New takes as the Manager's default and that an
// acquire call takes for that call alone: WithTTL, WithWait, WithRetry,
// WithWatchdog, WithMaxHold and WithFencing.
type Setting struct {
	manager func(*config)
	acquire func(*acquireConfig)
}

func (s Setting) apply(c *config) {
	if s.manager != nil {
		s.manager(c)
	}
}

func (s Setting) applyAcquire(c *acquireConfig) {
	if s.acquire != nil {
		s.acquire(c)
	}
}

// WithTTL sets the lock TTL, in [MinTTL, MaxTTL]. The default is 10 s: a
// crashed holder blocks others for at most that long, and the watchdog
// renews a live holder every TTL/3.
func WithTTL(d time.Duration) Setting {
	return Setting{func(c *config) { c.ttl = d }, func(c *acquireConfig) { c.ttl = d }}
}

// WithOwner sets the owner id written into every token (at most
// MaxOwnerLen bytes of printable UTF-8). The default is "<hostname>:<pid>".
// Give each process an id of its own: a release announces a hand-over on
// the channels of the owners concerned (sharding.HandoverChannel), and the
// processes that share an owner id all hear each other's.
func WithOwner(id string) Option { return optionFunc(func(c *config) { c.owner = id }) }

// WithLogger sets the logger. The default is zap.NewNop().
func WithLogger(l *zap.Logger) Option { return optionFunc(func(c *config) { c.logger = l }) }

// WithRetry sets Acquire's retry strategy, followed to the letter. The
// default is DefaultRetry().
func WithRetry(s RetryStrategy) Setting {
	return Setting{func(c *config) { c.retry, c.retrySet = s, true }, func(c *acquireConfig) { c.retry, c.retrySet = s, true }}
}

// WithWait sets Acquire's wait limit, in (0, MaxWait]. The default is 30 s.
// The caller's context can end the wait sooner. One attempt without a wait
// is what the Try forms make (TryAcquire, TryAcquireBatch, ...).
func WithWait(d time.Duration) Setting {
	return Setting{func(c *config) { c.wait = d }, func(c *acquireConfig) { c.wait = d }}
}

// WithWatchdog turns automatic renewal of held locks on or off. The default
// is on. Without it a lock lives for its TTL unless extended, and its
// Context is cancelled when the TTL runs out.
func WithWatchdog(on bool) Setting {
	return Setting{func(c *config) { c.watchdog = on }, func(c *acquireConfig) { c.watchdog = on }}
}

// WithRenewInterval sets how often the watchdog renews a lock: at least
// MinRenewInterval and below the TTL. The default (0) is TTL/3.
func WithRenewInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.renewInterval = d })
}

// WithMaxHold sets the default max hold: the watchdog stops renewing a lock
// at that age and cancels its Context with ErrMaxHoldExceeded (the hard
// fuse against a holder stuck forever). The default (0) is no limit; a max
// hold beyond any reachable time (math.MaxInt64) is no limit either.
func WithMaxHold(d time.Duration) Setting {
	return Setting{func(c *config) { c.maxHold = d }, func(c *acquireConfig) { c.maxHold = d }}
}

// WithRenewClient sends the watchdog's renewals through a client of their
// own, so a busy main pool cannot starve them. The default is the main client.
func WithRenewClient(rc redis.UniversalClient) Option {
	return optionFunc(func(c *config) { c.renewClient = rc })
}

// WithFencing makes acquires take a fencing token (see Lock.Fence). The
// default is off.
func WithFencing(on bool) Setting {
	return Setting{func(c *config) { c.fencing = on }, func(c *acquireConfig) { c.fencing = on }}
}

// WithReplicaAck makes acquire and Extend wait, with WAIT n timeout on the
// connection that wrote the key, until n replicas have the write. policy
// says what fewer than n does. The default is no WAIT.
func WithReplicaAck(n int, timeout time.Duration, policy ReplicaPolicy) Option {
	return optionFunc(func(c *config) { c.replicas, c.replicaTimeout, c.replicaPolicy = n, timeout, policy })
}

// WithCoalescing turns coalescing on or off for acquire, release, extend
// and TTL. On (the default, for every client kind) concurrent callers'
// commands for one server (the standalone or Sentinel-managed server, or
// each master of a cluster) go out together as one pipeline, and each
// caller waits for its own reply until its context's deadline, or at most
// 2 ms after its context is cancelled. Every command is
// sent once: a reply that says it did not run (MOVED, ASK, TRYAGAIN,
// CLUSTERDOWN, LOADING, MASTERDOWN, READONLY) sends it again alone, and
// nothing that ran is ever sent twice. A command whose caller has gone
// before it was sent is never sent. Off, each call sends its commands
// itself, one at a time, never twice either.
//
// go-redis's AutoPipeline() is never used: its pipelines re-send answered
// commands after a connection error or a "not now" reply, which makes a
// held lock look lost or a released lock look not held.
func WithCoalescing(on bool) Option { return optionFunc(func(c *config) { c.coalescing = &on }) }

// WithConditionalCommands says whether the Manager releases and extends
// unfenced locks with the server's conditional commands (DELIFEQ or DELEX
// ... IFEQ, SET ... IFEQ), hands a contended one over in them (RPUSHX to join the queue;
// one script of LPOP, SET ... IFEQ and SPUBLISH to hand it on), and makes an unfenced
// batch's first try with MSETEX ... NX PX, where every master runs them,
// as the startup check finds (default on);
// off, every call goes by the Lua scripts, as on servers without them.
// Without the startup check the scripts are used.
func WithConditionalCommands(on bool) Option {
	return optionFunc(func(c *config) { c.conditional = &on })
}

// WithStartupCheck turns the checks New makes (server versions, script
// preload) on or off. They are on by default.
func WithStartupCheck(on bool) Option {
	return optionFunc(func(c *config) { c.startupCheck = on })
}

// WithTraceID sets a function that reads a trace id from a call's context;
// log lines then carry it as "trace_id".
func WithTraceID(f func(context.Context) string) Option {
	return optionFunc(func(c *config) { c.traceID = f })
}

// WithNotifications turns the fair queue on or off. On (the default), a
// waiting Acquire of one resource queues up in Redis (on the lock's waiter
// list) and its manager listens on the lock's channels (sharded pub/sub, one
// connection per node shared by all waiters): a release hands the lock to
// the first queued waiter and announces it to that waiter's manager (and
// to the managers of the two waiters queued next, nobody else), so the waiter
// holds the lock when it hears. Announcements can be lost and an expiring key announces
// nothing, so queued waiters also re-check, on the retry strategy's timer
// but at most every 100 ms. A waiting batch (AcquireBatch, and the busy
// groups of AcquireMulti) does not queue: it marks the keys others hold,
// listens on their channels, and tries again when a release announces one
// of them free, else on the retry strategy's timer. Off, waiters only
// poll, and never get a lock that queued waiters are owed. Acquires under
// WithReplicaAck always poll.
func WithNotifications(on bool) Option { return optionFunc(func(c *config) { c.notifications = on }) }

// WithMaxLocalWaiters caps the Acquire calls of this Manager waiting for
// one resource; past it, Acquire fails at once with ErrTooManyWaiters.
// The default (0) is no cap.
func WithMaxLocalWaiters(n int) Option { return optionFunc(func(c *config) { c.maxWaiters = n }) }

// WithMetrics records the manager's acquires, releases, renewals, losses,
// holds and waiters in m (see package metrics). The default is no metrics.
func WithMetrics(m *metrics.Metrics) Option { return optionFunc(func(c *config) { c.metrics = m }) }

// WithClassFunc names the metrics lock class of a resource when the acquire
// does not (WithClass). It must return a small set of names: a
// prefix of the resource, say, never the resource itself (past the
// metrics' class cap, classes fold into "overflow"). The default is
// metrics.ClassOf, the resource's namespace ("order" for "order:123"),
// which the exporter and the shardlock tool's list -class use too.
func WithClassFunc(f func(resource string) string) Option {
	return optionFunc(func(c *config) { c.classFunc = f })
}

func (c *config) validate() error {
	if err := sharding.ValidatePrefix(c.prefix); err != nil {
		return invalid("key prefix", "%q must not contain '{' or '}'", c.prefix)
	}
	if err := checkTTL(c.ttl); err != nil {
		return err
	}
	if err := validateOwner(c.owner); err != nil {
		return err
	}
	if c.logger == nil {
		return invalid("logger", "nil")
	}
	if err := checkRetry(c.retry); err != nil {
		return err
	}
	if err := checkWait(c.wait); err != nil {
		return err
	}
	if err := checkRenew(c.renewInterval, c.ttl); err != nil {
		return err
	}
	if c.maxHold < 0 {
		return invalid("max hold", "%v is negative", c.maxHold)
	}
	if c.replicas < 0 || (c.replicas > 0 && c.replicaTimeout <= 0) {
		return invalid("replica ack", "want n >= 0 replicas and a positive timeout, got %d and %v", c.replicas, c.replicaTimeout)
	}
	if c.replicas > 0 && c.replicaTimeout >= c.ttl {
		return invalid("replica ack", "timeout %v must be below the TTL %v", c.replicaTimeout, c.ttl)
	}
	if c.replicaPolicy != ReplicaFail && c.replicaPolicy != ReplicaReport {
		return invalid("replica ack", "unknown policy %d", c.replicaPolicy)
	}
	if c.maxWaiters < 0 {
		return invalid("max local waiters", "%d is negative", c.maxWaiters)
	}
	return nil
}

func checkTTL(d time.Duration) error {
	if d < MinTTL || d > MaxTTL {
		return invalid("ttl", "%v is outside [%v, %v]", d, MinTTL, MaxTTL)
	}
	return nil
}

func checkWait(d time.Duration) error {
	if d <= 0 || d > MaxWait {
		return invalid("wait", "%v is outside (0, %v]; for one attempt, call a Try form (TryAcquire, ...)", d, MaxWait)
	}
	return nil
}

func checkRenew(interval, ttl time.Duration) error {
	if interval < 0 || (interval > 0 && (interval < MinRenewInterval || interval >= ttl)) {
		return invalid("renew interval", "%v must be at least %v and below the TTL %v", interval, MinRenewInterval, ttl)
	}
	return nil
}

func validateOwner(s string) error {
	if s == "" || len(s) > MaxOwnerLen || !printable(s) {
		return invalid("owner", "want 1 to %d bytes of printable UTF-8", MaxOwnerLen)
	}
	return nil
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// AcquireOption configures one acquire: a Setting, or WithClass.
type AcquireOption interface{ applyAcquire(*acquireConfig) }

type acquireConfig struct {
	ttl      time.Duration
	wait     time.Duration
	retry    RetryStrategy
	retrySet bool // retry is the caller's (WithRetry, to New or to the acquire), followed to the letter
	fencing  bool
	maxHold  time.Duration
	watchdog bool
	interval time.Duration
	ttlMs    any // ttl in milliseconds, a string formatted and boxed once
	class    string
	cls      *metrics.Class // resolved by acquire; nil without metrics
}

type acquireOptionFunc func(*acquireConfig)

func (f acquireOptionFunc) applyAcquire(c *acquireConfig) { f(c) }

// WithClass names the metrics lock class of the lock an acquire takes
// (see WithClassFunc, which names it when no WithClass is given).
func WithClass(name string) AcquireOption {
	return acquireOptionFunc(func(c *acquireConfig) { c.class = name })
}
