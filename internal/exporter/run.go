package exporter

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/shardlock/shardlock/internal/slotmap"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/metrics"
	"github.com/shardlock/shardlock/sharding"
)

// Run scans and probes on their intervals until ctx ends, then stops its
// goroutines and waits for them. The first scan and probe run at once.
func (e *Exporter) Run(ctx context.Context) error {
	m, err := manager.New(ctx, e.client, manager.WithKeyPrefix(e.cfg.ProbePrefix), manager.WithWatchdog(false),
		manager.WithTTL(max(e.cfg.ProbeTimeout*2, time.Second)), manager.WithOwner("shardlock-exporter-probe"),
		manager.WithStartupCheck(false))
	if err != nil {
		return err
	}
	e.probe = m
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = m.Close(cctx)
	}()
	var wg sync.WaitGroup
	wg.Go(func() { every(ctx, e.cfg.ScanInterval, func() { e.Scan(ctx) }) })
	wg.Go(func() { every(ctx, e.cfg.ProbeInterval, func() { e.Probe(ctx) }) })
	wg.Wait()
	return nil
}

// every runs f now and then every d until ctx ends.
func every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		f()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Probe acquires and releases a lock on every master (a resource whose
// slot that master serves), recording success and latency.
func (e *Exporter) Probe(ctx context.Context) {
	if e.probe == nil {
		return
	}
	var slots slotmap.Map
	if cc, ok := e.client.(*redis.ClusterClient); ok {
		s, err := slotmap.Read(ctx, cc)
		if err != nil {
			e.cfg.Logger.Warn("probe: CLUSTER SHARDS failed", zap.Error(err))
		}
		slots = s
	}
	results := map[string]probeResult{}
	var mu sync.Mutex
	_ = e.masters(ctx, func(ctx context.Context, addr string, _ *redis.Client) error {
		resource := probeResource(addr, slots)
		pctx, cancel := context.WithTimeout(ctx, e.cfg.ProbeTimeout)
		defer cancel()
		start := time.Now()
		l, err := e.probe.TryAcquire(pctx, resource)
		if err == nil {
			err = l.Release(pctx)
		}
		mu.Lock()
		results[addr] = probeResult{ok: err == nil, duration: time.Since(start)}
		mu.Unlock()
		if err != nil {
			e.cfg.Logger.Warn("probe failed", zap.String("event", "probe_failed"), zap.String("master", addr), zap.Error(err))
		}
		return nil
	})
	e.mu.Lock()
	e.probes = results
	e.mu.Unlock()
}

// probeResource returns a resource whose slot addr serves (any resource on
// a standalone server).
func probeResource(addr string, slots slotmap.Map) string {
	for i := range 100000 {
		r := fmt.Sprintf("probe-%d", i)
		if len(slots) == 0 {
			return r
		}
		if cs, ok := slots.Of(sharding.Slot(r)); ok && cs.Master == addr {
			return r
		}
	}
	return "probe-0"
}

// Describe sends the exporter's metric descriptions.
func (e *Exporter) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range e.descs {
		ch <- d
	}
}

// Collect serves the last scan and probe results.
func (e *Exporter) Collect(ch chan<- prometheus.Metric) {
	e.mu.Lock()
	res, lastSuccess := e.last, e.lastSuccess
	probes := e.probes
	e.mu.Unlock()
	g := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(e.descs[name], prometheus.GaugeValue, v, labels...)
	}
	c := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(e.descs[name], prometheus.CounterValue, v, labels...)
	}
	for addr, p := range probes {
		g(metrics.ProbeSuccess, b2f(p.ok), addr)
		g(metrics.ProbeDurationSeconds, p.duration.Seconds(), addr)
	}
	if res == nil {
		g(metrics.ScanUp, 0)
		return
	}
	g(metrics.ScanUp, b2f(res.Errors == 0))
	g(metrics.ScanDurationSeconds, res.Duration.Seconds())
	g(metrics.ScanKeysExamined, float64(res.Examined))
	g(metrics.ScanTruncated, b2f(res.Truncated))
	g(metrics.ScanErrors, float64(res.Errors))
	for _, reason := range metrics.ScanSkipReasons {
		g(metrics.ScanSkippedKeys, float64(res.Skipped[reason]), reason)
	}
	if !lastSuccess.IsZero() {
		g(metrics.ScanLastSuccessTimestamp, float64(lastSuccess.UnixNano())/1e9)
	}
	for class, st := range res.Classes {
		g(metrics.LockKeys, float64(st.Keys), class)
		g(metrics.LockKeysWithoutExpiry, float64(st.WithoutExpiry), class)
		g(metrics.LockKeysOverdue, float64(st.Overdue), class)
		var oldest float64
		if !st.Oldest.IsZero() {
			oldest = float64(st.Oldest.UnixNano()) / 1e9
		}
		g(metrics.LockKeyOldestAcquiredSeconds, oldest, class)
	}
	for addr, ms := range res.Masters {
		g(metrics.RedisOpsPerSecond, ms.OpsPerSecond, addr)
		g(metrics.RedisConnectedClients, ms.ConnectedClients, addr)
		g(metrics.RedisBlockedClients, ms.BlockedClients, addr)
		c(metrics.RedisEvictedKeysTotal, ms.EvictedKeys, addr)
		c(metrics.RedisExpiredKeysTotal, ms.ExpiredKeys, addr)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
