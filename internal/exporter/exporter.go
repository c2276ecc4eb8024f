// Package exporter scans a Redis deployment (every master of a cluster)
// for shardlock's lock keys, probes every master with a synthetic lock, and
// serves what it found as Prometheus metrics (names from package metrics).
//
// Scans and probes run in the background on an interval, each bounded by a
// deadline and a key cap; a scrape serves the last result, so a million
// lock keys never make a scrape slow.
package exporter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/shardlock/shardlock/internal/keyscan"
	"github.com/shardlock/shardlock/internal/rwhash"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/metrics"
	"github.com/shardlock/shardlock/sharding"
)

// MaxProbeTimeout is the longest probe timeout: a probe lock lives twice
// as long, and a lock's TTL is at most manager.MaxTTL.
const MaxProbeTimeout = manager.MaxTTL / 2

// Config configures an Exporter. Zero values take the defaults shown.
type Config struct {
	Prefix        string        // lock key prefix; default sharding.DefaultPrefix
	ScanInterval  time.Duration // default 30 s
	ScanTimeout   time.Duration // deadline of one scan; default 20 s
	ScanCount     int64         // SCAN COUNT; default 1000
	MaxKeys       int           // keys examined per scan at most; default 2,000,000
	Overdue       time.Duration // a lock held longer is overdue; default 15 min
	ProbeInterval time.Duration // default 15 s
	ProbeTimeout  time.Duration // default 2 s
	ProbePrefix   string        // key prefix of probe locks; default "shardlock-probe:"
	MaxClasses    int           // distinct lock classes at most; default 10
	// ClassOf names the lock class of a resource; default: the resource up
	// to its first ':' (without braces).
	ClassOf func(resource string) string
	Logger  *zap.Logger
}

func (c *Config) defaults() {
	if c.Prefix == "" {
		c.Prefix = sharding.DefaultPrefix
	}
	if c.ScanInterval == 0 {
		c.ScanInterval = 30 * time.Second
	}
	if c.ScanTimeout == 0 {
		c.ScanTimeout = 20 * time.Second
	}
	if c.ScanCount == 0 {
		c.ScanCount = 1000
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = 2_000_000
	}
	if c.Overdue == 0 {
		c.Overdue = 15 * time.Minute
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = 15 * time.Second
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = 2 * time.Second
	}
	if c.ProbePrefix == "" {
		c.ProbePrefix = "shardlock-probe:"
	}
	if c.MaxClasses == 0 {
		c.MaxClasses = metrics.DefaultMaxClasses
	}
	if c.ClassOf == nil {
		c.ClassOf = metrics.ClassOf
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
}

// ClassStats is what a scan found for one lock class.
type ClassStats struct {
	Keys, WithoutExpiry, Overdue int
	Oldest                       time.Time // zero when no key had a parseable token
}

// MasterStats is what a scan read from one master's INFO.
type MasterStats struct {
	OpsPerSecond, ConnectedClients, BlockedClients, EvictedKeys, ExpiredKeys float64
}

// ScanResult is the outcome of one scan of every master.
type ScanResult struct {
	Classes   map[string]*ClassStats
	Masters   map[string]MasterStats
	Examined  int
	Skipped   map[string]int // keys that are no lock keys, by reason (metrics.ScanSkipReasons)
	Truncated bool
	Errors    int
	Duration  time.Duration
	Ended     time.Time
}

type probeResult struct {
	ok       bool
	duration time.Duration
}

// Exporter scans, probes and serves. Create it with New, run it with Run.
type Exporter struct {
	client redis.UniversalClient
	cfg    Config
	probe  *manager.Manager

	mu          sync.Mutex
	last        *ScanResult
	lastSuccess time.Time
	probes      map[string]probeResult
	descs       map[string]*prometheus.Desc
}

// New returns an Exporter of client. It makes no round trip.
func New(client redis.UniversalClient, cfg Config) (*Exporter, error) {
	if client == nil {
		return nil, errors.New("exporter: nil client")
	}
	cfg.defaults()
	if err := sharding.ValidatePrefix(cfg.Prefix); err != nil {
		return nil, fmt.Errorf("exporter: prefix %q: %w", cfg.Prefix, err)
	}
	if cfg.ScanCount < 1 || cfg.MaxKeys < 1 || cfg.MaxClasses < 1 || cfg.ScanInterval < 0 || cfg.ProbeInterval < 0 ||
		cfg.ScanTimeout < 0 || cfg.ProbeTimeout < 0 || cfg.Overdue < 0 {
		return nil, errors.New("exporter: scan count, max keys, max classes, intervals, timeouts and overdue must be positive")
	}
	if cfg.ProbeTimeout > MaxProbeTimeout {
		return nil, fmt.Errorf("exporter: probe timeout %v is more than %v", cfg.ProbeTimeout, MaxProbeTimeout)
	}
	e := &Exporter{client: client, cfg: cfg, probes: map[string]probeResult{}, descs: map[string]*prometheus.Desc{}}
	for _, d := range metrics.Exporter {
		e.descs[d.Name] = prometheus.NewDesc(d.Name, d.Help, d.Labels, nil)
	}
	return e, nil
}

// masters calls f for every master: each master of a cluster, or the one
// server.
func (e *Exporter) masters(ctx context.Context, f func(ctx context.Context, addr string, c *redis.Client) error) error {
	switch c := e.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return f(ctx, n.Options().Addr, n) })
	case *redis.Client:
		return f(ctx, c.Options().Addr, c)
	}
	return fmt.Errorf("exporter: unsupported client %T", e.client)
}

// Scan makes one pass over every master: SCAN for the lock prefix with a
// bounded COUNT, pipelined GET and PTTL of each batch of keys, and INFO.
// It stops at the key cap or the scan deadline (Truncated).
func (e *Exporter) Scan(ctx context.Context) *ScanResult {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.ScanTimeout)
	defer cancel()
	start := time.Now()
	res := &ScanResult{Classes: map[string]*ClassStats{}, Masters: map[string]MasterStats{}, Skipped: map[string]int{}}
	var mu sync.Mutex
	var examined int
	classes := newClassBounder(e.cfg.MaxClasses)
	err := e.masters(ctx, func(ctx context.Context, addr string, c *redis.Client) error {
		ms, err := masterStats(ctx, c)
		if err != nil {
			return err
		}
		mu.Lock()
		res.Masters[addr] = ms
		mu.Unlock()
		return keyscan.Walk(ctx, c, e.cfg.Prefix+"*", e.cfg.ScanCount, func(keys []string, more bool) (bool, error) {
			// Take no more keys than the cap has left (masters scan at once).
			mu.Lock()
			budget := e.cfg.MaxKeys - examined
			cut := len(keys) > budget
			if cut {
				keys = keys[:max(budget, 0)]
			}
			examined += len(keys)
			stop := examined >= e.cfg.MaxKeys
			if cut || (stop && more) {
				res.Truncated = true // there were more
			}
			mu.Unlock()
			return stop, e.examine(ctx, c, keys, res, &mu, classes, start)
		})
	})
	res.Examined = examined
	if err != nil {
		res.Errors++
		if errors.Is(err, context.DeadlineExceeded) {
			res.Truncated = true
		}
		e.cfg.Logger.Warn("scan failed", zap.String("event", "scan_failed"), zap.Error(err))
	}
	res.Duration = time.Since(start)
	res.Ended = time.Now()
	e.mu.Lock()
	e.last = res
	if res.Errors == 0 && !res.Truncated {
		e.lastSuccess = res.Ended
	}
	e.mu.Unlock()
	return res
}

// kv is a key's reads in examine's pipeline.
type kv struct {
	key  string
	get  *redis.StringCmd
	pttl *redis.DurationCmd
}

// examine reads the value and PTTL of keys in one pipeline, and the fields
// of the read-write locks among them (hashes) in a second one.
func (e *Exporter) examine(ctx context.Context, c *redis.Client, keys []string, res *ScanResult, mu *sync.Mutex,
	classes *classBounder, now time.Time) error {
	if len(keys) == 0 {
		return nil
	}
	pipe := c.Pipeline()
	batch := make([]kv, 0, len(keys))
	for _, k := range keys {
		if sharding.IsHelperKey(k) {
			continue
		}
		batch = append(batch, kv{key: k, get: pipe.Get(ctx, k), pttl: pipe.PTTL(ctx, k)})
	}
	if len(batch) == 0 {
		return nil
	}
	// Exec's error is the first command's; each command is judged on its
	// own below, so one odd key never fails the scan.
	_, _ = pipe.Exec(ctx)
	var hashes []kv // WRONGTYPE: maybe read-write locks
	mu.Lock()
	for _, b := range batch {
		val, err := b.get.Result()
		if errors.Is(err, redis.Nil) {
			continue // expired between SCAN and GET
		}
		if err != nil {
			var reply redis.Error
			if !errors.As(err, &reply) {
				mu.Unlock()
				return err // the connection failed: the scan did
			}
			if strings.HasPrefix(err.Error(), "WRONGTYPE") {
				hashes = append(hashes, b)
				continue
			}
			if msg := err.Error(); strings.HasPrefix(msg, "ASK ") || strings.HasPrefix(msg, "MOVED ") {
				continue // its slot left the node since the SCAN: counted where it is, if the scan is yet to get there
			}
			// An error reply: a key that cannot be read. Not a lock key:
			// skipped, counted, left alone.
			res.Skipped[metrics.ReasonUnreadable]++
			continue
		}
		st := res.class(classes.name(e.cfg.ClassOf(resourceOf(e.cfg.Prefix, b.key))))
		st.Keys++
		if b.pttl.Val() == -1 { // go-redis keeps PTTL's "no expiry" reply as -1
			st.WithoutExpiry++
		}
		if info, err := manager.ParseToken(val); err == nil {
			st.sawHolder(info.AcquiredAt, now, e.cfg.Overdue)
		}
	}
	mu.Unlock()
	return e.examineHashes(ctx, c, hashes, res, mu, classes, now)
}

// examineHashes reads, in one pipeline, the keys that are not strings:
// each read-write lock among them that someone holds counts as a lock key
// of its class, as old as its oldest live holder; the others are skipped.
func (e *Exporter) examineHashes(ctx context.Context, c *redis.Client, hashes []kv, res *ScanResult, mu *sync.Mutex,
	classes *classBounder, now time.Time) error {
	if len(hashes) == 0 {
		return nil
	}
	pipe := c.Pipeline()
	fields := make([]*redis.MapStringStringCmd, len(hashes))
	for i, h := range hashes {
		fields[i] = pipe.HGetAll(ctx, h.key)
	}
	_, _ = pipe.Exec(ctx)
	mu.Lock()
	defer mu.Unlock()
	for i, h := range hashes {
		f, err := fields[i].Result()
		var reply redis.Error
		if err != nil && !errors.As(err, &reply) {
			return err // the connection failed: the scan did
		}
		holders, ok := rwHolders(f, now)
		if err != nil || !ok {
			// A key that is not a string and not a read-write lock: not
			// a lock key: skipped, counted, left alone.
			res.Skipped[metrics.ReasonWrongType]++
			continue
		}
		if len(holders) == 0 {
			continue // a read-write lock nobody holds
		}
		st := res.class(classes.name(e.cfg.ClassOf(resourceOf(e.cfg.Prefix, h.key))))
		st.Keys++
		if h.pttl.Val() == -1 {
			st.WithoutExpiry++
		}
		st.sawHolder(slices.MinFunc(holders, time.Time.Compare), now, e.cfg.Overdue) // a key is as old as its oldest holder
	}
	return nil
}

// rwHolders returns when each live holder of a read-write lock (the
// fields f of its hash) acquired it: its writer, or each of its readers;
// false when f is not a read-write lock's.
func rwHolders(f map[string]string, now time.Time) ([]time.Time, bool) {
	st, ok := rwhash.Parse(f, now)
	if !ok {
		return nil, false
	}
	var out []time.Time
	for _, tok := range append(st.Readers, st.Writer) {
		if info, err := manager.ParseToken(tok); err == nil {
			out = append(out, info.AcquiredAt)
		}
	}
	return out, true
}

// class returns the stats of class name, made on first use.
func (res *ScanResult) class(name string) *ClassStats {
	st := res.Classes[name]
	if st == nil {
		st = &ClassStats{}
		res.Classes[name] = st
	}
	return st
}

// sawHolder counts a key whose (oldest) holder acquired it at acquiredAt:
// overdue past overdue, and the oldest so far.
func (st *ClassStats) sawHolder(acquiredAt, now time.Time, overdue time.Duration) {
	if now.Sub(acquiredAt) > overdue {
		st.Overdue++
	}
	if st.Oldest.IsZero() || acquiredAt.Before(st.Oldest) {
		st.Oldest = acquiredAt
	}
}

func masterStats(ctx context.Context, c *redis.Client) (MasterStats, error) {
	info, err := c.Info(ctx).Result() // the default sections hold clients and stats
	if err != nil {
		return MasterStats{}, err
	}
	f := func(name string) float64 {
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
				x, _ := strconv.ParseFloat(v, 64)
				return x
			}
		}
		return 0
	}
	return MasterStats{
		OpsPerSecond: f("instantaneous_ops_per_sec"), ConnectedClients: f("connected_clients"),
		BlockedClients: f("blocked_clients"), EvictedKeys: f("evicted_keys"), ExpiredKeys: f("expired_keys"),
	}, nil
}

// classBounder folds classes past a cap into "overflow".
type classBounder struct {
	max  int
	seen map[string]bool
}

func newClassBounder(max int) *classBounder { return &classBounder{max: max, seen: map[string]bool{}} }

func (b *classBounder) name(c string) string {
	c = metrics.ClassLabel(c)
	if c == metrics.ClassOther || b.seen[c] {
		return c
	}
	if len(b.seen) >= b.max {
		return metrics.ClassOverflow
	}
	b.seen[c] = true
	return c
}

// resourceOf is the resource of a lock key found by a scan under prefix.
func resourceOf(prefix, key string) string {
	r, _ := sharding.ResourceOf(prefix, key)
	return r
}
