package exporter_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/shardlock/shardlock/internal/exporter"
	"github.com/shardlock/shardlock/internal/testenv"
)

// BenchmarkScan fills the test cluster with N lock keys (N from
// SHARDLOCK_BENCH_SCAN_KEYS, default 10,000; the README's figure uses
// 1,000,000) and measures one full scan: its time and the Go heap it
// allocates and keeps.
func BenchmarkScan(b *testing.B) {
	n := 10000
	if v := os.Getenv("SHARDLOCK_BENCH_SCAN_KEYS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > 5_000_000 {
			b.Fatalf("SHARDLOCK_BENCH_SCAN_KEYS=%q", v)
		}
	}
	c := testenv.Cluster(b)
	ctx := context.Background()
	prefix := testenv.Unique("scanbench") + ":"
	tok := "sl1." + strconv.FormatInt(time.Now().UnixMilli(), 10) + ".AAAAAAAAAAAAAAAAAAAAAA.bench"
	const batch = 10000
	for i := 0; i < n; i += batch {
		pipe := c.Pipeline()
		for j := i; j < min(i+batch, n); j++ {
			pipe.Set(ctx, fmt.Sprintf("%s{order:%d}", prefix, j), tok, 30*time.Minute)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		for i := 0; i < n; i += batch {
			pipe := c.Pipeline()
			for j := i; j < min(i+batch, n); j++ {
				pipe.Unlink(ctx, fmt.Sprintf("%s{order:%d}", prefix, j))
			}
			_, _ = pipe.Exec(ctx)
		}
	})
	e, err := exporter.New(c, exporter.Config{Prefix: prefix, ScanTimeout: 10 * time.Minute, MaxKeys: 10_000_000})
	if err != nil {
		b.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	// Peak heap while scanning, sampled every 50 ms.
	var peak uint64
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				peak = max(peak, ms.HeapInuse)
			}
		}
	}()
	b.ResetTimer()
	var res *exporter.ScanResult
	for range b.N {
		res = e.Scan(ctx)
	}
	b.StopTimer()
	close(stop)
	<-sampled
	runtime.ReadMemStats(&after)
	if res.Errors != 0 || res.Truncated || res.Classes["order"] == nil || res.Classes["order"].Keys != n {
		b.Fatalf("scan: errors %d truncated %v classes %+v", res.Errors, res.Truncated, res.Classes["order"])
	}
	b.ReportMetric(float64(n), "keys")
	b.ReportMetric(res.Duration.Seconds(), "s/scan")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(b.N)/1e6, "MB-allocated/scan")
	b.ReportMetric(float64(after.HeapInuse)/1e6, "MB-heap-after")
	b.ReportMetric(float64(peak)/1e6, "MB-heap-peak")
}
