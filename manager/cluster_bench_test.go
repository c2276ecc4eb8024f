package manager_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// BenchmarkBatch compares a single lock with a batch of 10 co-located
// resources, on the cluster, one goroutine: acquire+release, and the
// acquire alone (the release outside the timer).
func BenchmarkBatch(b *testing.B) {
	c := testenv.Cluster(b)
	m := newManager(b, c)
	ctx := context.Background()
	run := testenv.Unique("batch")
	single := func(ctx context.Context) (*manager.Lock, error) { return m.TryAcquire(ctx, run) }
	res := group(b, run, "a", "b", "c", "d", "e", "f", "g", "h", "i", "j")
	batch := func(ctx context.Context) (*manager.Lock, error) { return m.TryAcquireBatch(ctx, res) }
	for _, mode := range []string{"acquire+release", "acquire"} {
		for _, impl := range []struct {
			name    string
			acquire func(context.Context) (*manager.Lock, error)
		}{{"single", single}, {"batch10", batch}} {
			b.Run(mode+"/"+impl.name, func(b *testing.B) {
				for b.Loop() {
					l, err := impl.acquire(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if mode == "acquire" {
						b.StopTimer()
					}
					if err := l.Release(ctx); err != nil {
						b.Fatal(err)
					}
					if mode == "acquire" {
						b.StartTimer()
					}
				}
			})
		}
	}
}

// BenchmarkHotResource: 16 goroutines over 4 managers lock one hot
// resource for 1 ms per operation, either as one key or striped 8 ways by
// a partition id (each goroutine works on its own partitions).
func BenchmarkHotResource(b *testing.B) {
	addrs := testenv.ClusterAddrs(b)
	_ = addrs
	var ms []*manager.Manager
	for range 4 {
		ms = append(ms, newManager(b, testenv.Cluster(b)))
	}
	for _, stripes := range []int{1, 8} {
		b.Run(fmt.Sprintf("stripes=%d", stripes), func(b *testing.B) {
			res := testenv.Unique("hot")
			ctx := context.Background()
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for g := range 16 {
				m := ms[g%4]
				wg.Go(func() {
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						var l *manager.Lock
						var err error
						if stripes == 1 {
							l, err = m.Acquire(ctx, res)
						} else {
							l, err = m.AcquireStripe(ctx, res, stripes, fmt.Sprintf("partition-%d", i))
						}
						if err != nil {
							b.Error(err)
							return
						}
						time.Sleep(time.Millisecond)
						_ = l.Release(ctx)
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}
