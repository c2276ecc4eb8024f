package exporter_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/shardlock/shardlock/internal/exporter"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/metrics"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// oldToken is a token acquired an hour ago.
func oldToken() string {
	return "sl1." + strconv.FormatInt(time.Now().Add(-time.Hour).UnixMilli(), 10) + ".AAAAAAAAAAAAAAAAAAAAAA.old-owner"
}

// forEachScanTarget runs f against the real standalone server and the real
// cluster (the Sentinel target is the standalone server again).
func forEachScanTarget(t *testing.T, f func(t *testing.T, ctx context.Context, c redis.UniversalClient)) {
	for _, target := range testenv.Targets() {
		if target.Name == "sentinel" {
			continue
		}
		t.Run(target.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			f(t, ctx, target.Client(t))
		})
	}
}

func TestScanAndProbeCluster(t *testing.T) {
	forEachScanTarget(t, func(t *testing.T, ctx context.Context, c redis.UniversalClient) {
		prefix := testenv.Unique("exp") + ":"
		m, err := manager.New(ctx, c, manager.WithKeyPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close(ctx)
		for i := range 50 {
			if _, err := m.TryAcquire(ctx, fmt.Sprintf("order:%d", i), manager.WithFencing(true)); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 5 {
			if _, err := m.TryAcquire(ctx, fmt.Sprintf("{job:%d}:run", i)); err != nil {
				t.Fatal(err)
			}
		}
		// A leaked key (no TTL) and an overdue one.
		c.Set(ctx, prefix+"{leak:1}", oldToken(), 0)
		c.Set(ctx, prefix+"{report:1}", oldToken(), time.Minute)
		defer c.Del(ctx, prefix+"{leak:1}")

		e, err := exporter.New(c, exporter.Config{Prefix: prefix, ScanCount: 7, Overdue: 10 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		res := e.Scan(ctx)
		if res.Errors != 0 || res.Truncated {
			t.Fatalf("scan: %+v", res)
		}
		wantMasters := 1
		if _, ok := c.(*redis.ClusterClient); ok {
			wantMasters = 3
		}
		if len(res.Masters) != wantMasters {
			t.Fatalf("masters %v", res.Masters)
		}
		check := func(class string, keys, noExpiry, overdue int) {
			t.Helper()
			st := res.Classes[class]
			if st == nil || st.Keys != keys || st.WithoutExpiry != noExpiry || st.Overdue != overdue {
				t.Errorf("class %s: %+v, want keys %d, no expiry %d, overdue %d", class, st, keys, noExpiry, overdue)
			}
		}
		check("order", 50, 0, 0)
		check("job", 5, 0, 0)
		check("leak", 1, 1, 1)
		check("report", 1, 0, 1)
		// 50 fence counters were skipped: 57 lock keys examined plus 50 helper keys.
		if res.Examined != 107 {
			t.Errorf("examined %d keys, want 107", res.Examined)
		}

		reg := prometheus.NewRegistry()
		reg.MustRegister(e)
		if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
			t.Fatalf("lint: %v %v", problems, err)
		}
		want := `
# HELP shardlock_lock_keys_without_expiry Lock keys with no TTL found by the last background scan: leaked, they can never expire.
# TYPE shardlock_lock_keys_without_expiry gauge
shardlock_lock_keys_without_expiry{lock_class="job"} 0
shardlock_lock_keys_without_expiry{lock_class="leak"} 1
shardlock_lock_keys_without_expiry{lock_class="order"} 0
shardlock_lock_keys_without_expiry{lock_class="report"} 0
`
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), metrics.LockKeysWithoutExpiry); err != nil {
			t.Fatal(err)
		}

		// The key cap truncates.
		small, _ := exporter.New(c, exporter.Config{Prefix: prefix, ScanCount: 5, MaxKeys: 10})
		if r := small.Scan(ctx); !r.Truncated || r.Examined != 10 {
			t.Fatalf("capped scan: truncated %v, examined %d", r.Truncated, r.Examined)
		}
	})
}

func TestRunProbesEveryMaster(t *testing.T) {
	c := testenv.Cluster(t)
	e, err := exporter.New(c, exporter.Config{Prefix: testenv.Unique("exp") + ":", ScanInterval: time.Hour, ProbeInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(e)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := testutil.GatherAndCount(reg, metrics.ProbeSuccess)
		if err == nil && n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe series: %d, %v", n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == metrics.ProbeSuccess {
			for _, mt := range mf.GetMetric() {
				if mt.GetGauge().GetValue() != 1 {
					t.Errorf("probe failed on %v", mt.GetLabel())
				}
			}
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Keys under the prefix that are not lock keys (a hash, a list, a set, a
// resource that is not UTF-8) are skipped and counted; the scan goes on,
// its gauges are served without a panic, and the keys are left as they are.
func TestScanSkipsHostileKeys(t *testing.T) {
	forEachScanTarget(t, func(t *testing.T, ctx context.Context, c redis.UniversalClient) {
		prefix := testenv.Unique("hostile") + ":"
		good := prefix + "{order:1}"
		hash, list, set := prefix+"{h}", prefix+"{l}", prefix+"{s}"
		badUTF8 := prefix + "{\xff\xfe:1}"
		for _, k := range []string{good, hash, list, set, badUTF8} {
			defer c.Del(ctx, k)
		}
		c.Set(ctx, good, oldToken(), time.Minute)
		c.HSet(ctx, hash, "f", "v")
		c.RPush(ctx, list, "a")
		c.SAdd(ctx, set, "a")
		c.Set(ctx, badUTF8, oldToken(), time.Minute)

		reg := prometheus.NewRegistry()
		e, err := exporter.New(c, exporter.Config{Prefix: prefix, ScanCount: 2})
		if err != nil {
			t.Fatal(err)
		}
		reg.MustRegister(e)
		res := e.Scan(ctx)
		if res.Errors != 0 {
			t.Fatalf("scan failed: %+v", res)
		}
		if res.Skipped[metrics.ReasonWrongType] != 3 {
			t.Fatalf("skipped %v, want 3 wrong_type", res.Skipped)
		}
		if st := res.Classes["order"]; st == nil || st.Keys != 1 {
			t.Fatalf("order class %+v", st)
		}
		if st := res.Classes[metrics.ClassOther]; st == nil || st.Keys != 1 {
			t.Fatalf("the non-UTF-8 resource's class: %+v (classes %v)", st, res.Classes)
		}
		n, err := testutil.GatherAndCount(reg, metrics.ScanUp, metrics.ScanSkippedKeys, metrics.LockKeys)
		if err != nil {
			t.Fatalf("gather: %v", err)
		}
		if n != 1+len(metrics.ScanSkipReasons)+2 {
			t.Fatalf("%d series", n)
		}
		if got := testutil.ToFloat64(gaugeOf(t, reg, metrics.ScanUp)); got != 1 {
			t.Fatalf("scan_up %v", got)
		}
		if c.HGet(ctx, hash, "f").Val() != "v" || c.LLen(ctx, list).Val() != 1 || c.SCard(ctx, set).Val() != 1 {
			t.Fatal("the scan changed a key that is not shardlock's")
		}
	})
}

// gaugeOf returns the one series of name in reg as a collector.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name string) prometheus.Gauge {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "copy"})
			g.Set(mf.GetMetric()[0].GetGauge().GetValue())
			return g
		}
	}
	t.Fatalf("no single series %s", name)
	return nil
}

// A read-write lock is a lock key to the scan: counted once in its class
// while anyone holds it, its oldest live holder (writer or reader) read
// from its hash; one that nobody holds, and a share whose time ran out,
// are not counted.
func TestScanCountsReadWriteLocks(t *testing.T) {
	forEachScanTarget(t, func(t *testing.T, ctx context.Context, c redis.UniversalClient) {
		prefix := testenv.Unique("rwscan") + ":"
		m, err := manager.New(ctx, c, manager.WithKeyPrefix(prefix), manager.WithOwner("scan-test"))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close(ctx)
		r1, err := m.TryAcquireRead(ctx, "{order:1}")
		if err != nil {
			t.Fatal(err)
		}
		r2, err := m.TryAcquireRead(ctx, "{order:1}")
		if err != nil {
			t.Fatal(err)
		}
		w, err := m.TryAcquireWrite(ctx, "{order:2}")
		if err != nil {
			t.Fatal(err)
		}
		free, _ := m.TryAcquireRead(ctx, "{order:3}")
		_ = free.Release(ctx)
		// An hour-old reader's share on order:1, and one whose time ran out.
		key1 := r1.Key()
		c.HSet(ctx, key1, "r:"+oldToken(), time.Now().Add(time.Minute).UnixMilli())
		c.HSet(ctx, key1, "r:"+strings.Replace(oldToken(), "old-owner", "gone-owner", 1), time.Now().Add(-time.Second).UnixMilli())
		defer func() {
			_ = r1.Release(ctx)
			_ = r2.Release(ctx)
			_ = w.Release(ctx)
		}()

		e, err := exporter.New(c, exporter.Config{Prefix: prefix, ScanCount: 2})
		if err != nil {
			t.Fatal(err)
		}
		res := e.Scan(ctx)
		if res.Errors != 0 {
			t.Fatalf("scan failed: %+v", res)
		}
		if res.Skipped[metrics.ReasonWrongType] != 0 {
			t.Fatalf("read-write locks skipped as wrong_type: %v", res.Skipped)
		}
		st := res.Classes["order"]
		if st == nil || st.Keys != 2 {
			t.Fatalf("order class %+v: want the 2 held read-write locks", st)
		}
		if st.Overdue != 1 || time.Since(st.Oldest) < 59*time.Minute {
			t.Fatalf("order class %+v: want the hour-old reader, overdue and oldest", st)
		}
	})
}
