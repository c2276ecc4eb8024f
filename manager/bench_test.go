package manager_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// runConcurrent runs op b.N times in all from g goroutines, each with its
// own index (for its own, uncontended resource).
func runConcurrent(b *testing.B, g int, op func(worker int) error) {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		fail atomic.Value
	)
	b.ResetTimer()
	for w := range g {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := op(w); err != nil {
					fail.CompareAndSwap(nil, err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := fail.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// compareAndDelete is the classic release script (redsync's, redislock's):
// the floor's release.
var compareAndDelete = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// floorOp is the least a lock can cost with go-redis: SET NX PX, then an
// EVALSHA compare-and-delete.
func floorOp(c redis.Scripter, set func(ctx context.Context, key, val string) (bool, error)) func(ctx context.Context, key, token string) error {
	return func(ctx context.Context, key, token string) error {
		ok, err := set(ctx, key, token)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("floor: %s contended", key)
		}
		return compareAndDelete.Run(ctx, c, []string{key}, token).Err()
	}
}

// BenchmarkAcquireRelease compares an uncontended acquire+release through
// the Manager (with and without coalescing) with the floor (go-redis
// directly) and the auto-pipelined floor, on the real standalone server and
// cluster, from 1, 16 and 64 goroutines, with context.Background() and
// go-redis's default client options.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, target := range testenv.Targets() {
		if target.Name == "sentinel" {
			continue // the standalone server again
		}
		b.Run(target.Name, func(b *testing.B) {
			c := target.Client(b)
			ap, err := c.AutoPipeline()
			if err != nil {
				b.Fatal(err)
			}
			if err := compareAndDelete.Load(context.Background(), c).Err(); err != nil {
				b.Fatal(err)
			}
			impls := []struct {
				name string
				op   func(ctx context.Context, worker int, run string) error
			}{
				{"floor", floorFor(c)},
				{"floor-autopipeline", floorFor(ap)},
				{"shardlock", managerFor(b, c, true)},
				{"shardlock-nocoalescing", managerFor(b, c, false)},
			}
			for _, g := range []int{1, 16, 64} {
				for _, impl := range impls {
					b.Run(fmt.Sprintf("g=%d/%s", g, impl.name), func(b *testing.B) {
						b.ReportAllocs()
						ctx := context.Background()
						run := testenv.Unique("bench")
						runConcurrent(b, g, func(w int) error { return impl.op(ctx, w, run) })
					})
				}
			}
		})
	}
}

func floorFor(c redis.UniversalClient) func(ctx context.Context, worker int, run string) error {
	op := floorOp(c, func(ctx context.Context, key, val string) (bool, error) {
		return c.SetNX(ctx, key, val, 10*time.Second).Result()
	})
	return func(ctx context.Context, w int, run string) error {
		return op(ctx, fmt.Sprintf("floor:{%s-%d}", run, w), fmt.Sprintf("tok-%d-%d", w, time.Now().UnixNano()))
	}
}

func managerFor(b *testing.B, c redis.UniversalClient, coalescing bool) func(ctx context.Context, worker int, run string) error {
	m := newManager(b, c, manager.WithCoalescing(coalescing))
	return func(ctx context.Context, w int, run string) error {
		l, err := m.TryAcquire(ctx, fmt.Sprintf("%s-%d", run, w))
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}
}

// BenchmarkWatchdog10k holds 10,000 locks on the cluster and counts the
// round trips (per-node pipelines) the watchdog spends per renew interval,
// in the steady state.
func BenchmarkWatchdog10k(b *testing.B) {
	addrs := testenv.ClusterAddrs(b)
	c := testenv.Cluster(b)
	renew := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	b.Cleanup(func() { _ = renew.Close() })
	var pipelines, renewals atomic.Int64
	renew.OnNewNode(func(node *redis.Client) { node.AddHook(&countHook{pipelines: &pipelines, cmds: &renewals}) })

	const (
		locks    = 10000
		interval = time.Second
	)
	m := newManager(b, c, manager.WithRenewClient(renew), manager.WithTTL(3*interval), manager.WithRenewInterval(interval))
	ctx := context.Background()
	run := testenv.Unique("wd")
	var wg sync.WaitGroup
	held := make([]*manager.Lock, locks)
	for w := range 64 {
		wg.Go(func() {
			for i := w; i < locks; i += 64 {
				l, err := m.TryAcquire(ctx, fmt.Sprintf("%s-%d", run, i))
				if err != nil {
					b.Error(err)
					return
				}
				held[i] = l
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		return
	}
	// The locks were taken over a few hundred ms, so the first renewals go
	// out in a few batches; each batch renews to one due time, and from
	// the second interval on they go together. Measure from then.
	time.Sleep(2 * interval)
	b.ResetTimer()
	pipelines.Store(0)
	renewals.Store(0)
	ticks := 0
	for range b.N {
		time.Sleep(interval) // the quantity measured is per interval of wall time
		ticks++
	}
	b.StopTimer()
	b.ReportMetric(float64(pipelines.Load())/float64(ticks), "roundtrips/tick")
	b.ReportMetric(float64(renewals.Load())/float64(ticks), "renewals/tick")
	for _, l := range held {
		if l.Err() != nil {
			b.Fatalf("lock lost while held: %v", l.Err())
		}
	}
}

type countHook struct{ pipelines, cmds *atomic.Int64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.pipelines.Add(1)
		h.cmds.Add(1)
		return next(ctx, cmd)
	}
}
func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.pipelines.Add(1)
		h.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}
