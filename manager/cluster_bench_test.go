package manager_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/benchkit"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

// BenchmarkBatch compares a single lock with a batch of 10 co-located
// resources, on the cluster, one goroutine: acquire+release, and the
// acquire alone (the release outside the timer). Beside the acquire, the
// floor of any one-script batch on this Redis: a script that only runs
// SET NX PX on each of the 10 keys (each key needs its own expiry, and
// Redis 7.0 has no command that sets one on several keys), sent by the
// same client, its keys deleted outside the timer; acquire/interleaved
// rotates it, the same floor storing a value as long as a shardlock token
// (floor-token: what the token's size costs the server), and the batch,
// call by call, and reports their medians and the batch's ratios to both.
// Every call has its own deadline, and the client has
// ContextTimeoutEnabled.
func BenchmarkBatch(b *testing.B) {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.ClusterAddrs(b), ContextTimeoutEnabled: true})
	b.Cleanup(func() { _ = c.Close() })
	m := newManager(b, c)
	run := testenv.Unique("batch")
	single := func(ctx context.Context) (func(context.Context) error, error) {
		l, err := m.TryAcquire(ctx, run)
		return l.Release, err
	}
	res := group(b, run, "a", "b", "c", "d", "e", "f", "g", "h", "i", "j")
	batch := func(ctx context.Context) (func(context.Context) error, error) {
		l, err := m.TryAcquireBatch(ctx, res)
		return l.Release, err
	}
	floorKeys := make([]string, len(res))
	for i, r := range res {
		floorKeys[i], _ = sharding.LockKey("floor:", r)
	}
	floorScript := redis.NewScript(`for i = 1, #KEYS do redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2], 'NX') end return 1`)
	floorWith := func(value string) func(ctx context.Context) (func(context.Context) error, error) {
		return func(ctx context.Context) (func(context.Context) error, error) {
			err := floorScript.Run(ctx, c, floorKeys, value, 30000).Err()
			return func(ctx context.Context) error { return c.Del(ctx, floorKeys...).Err() }, err
		}
	}
	floor := floorWith(run)
	// A value as long as the batch's token (the same owner, so the same length).
	l, err := m.TryAcquire(context.Background(), run)
	if err != nil {
		b.Fatal(err)
	}
	tokenLong := strings.Repeat("t", len(l.Token()))
	if err := l.Release(context.Background()); err != nil {
		b.Fatal(err)
	}
	type impl struct {
		name    string
		acquire func(context.Context) (func(context.Context) error, error)
	}
	// call runs f under a deadline of its own, as a service makes each call.
	call := func(f func(context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.Background(), benchkit.CallTimeout)
		defer cancel()
		return f(ctx)
	}
	// The acquires of the two floors and of the batch, call by call.
	b.Run("acquire/interleaved", func(b *testing.B) { benchInterleaved(b, floor, floorWith(tokenLong), batch) })
	for _, mode := range []struct {
		name  string
		impls []impl
	}{
		{"acquire+release", []impl{{"single", single}, {"batch10", batch}}},
		{"acquire", []impl{{"single", single}, {"lua-floor10", floor}, {"batch10", batch}}},
	} {
		for _, im := range mode.impls {
			b.Run(mode.name+"/"+im.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					var release func(context.Context) error
					if err := call(func(ctx context.Context) (err error) {
						release, err = im.acquire(ctx)
						return err
					}); err != nil {
						b.Fatal(err)
					}
					if mode.name == "acquire" {
						b.StopTimer()
					}
					if err := call(release); err != nil {
						b.Fatal(err)
					}
					if mode.name == "acquire" {
						b.StartTimer()
					}
				}
			})
		}
	}
}

// acquireTimed runs acquire under a deadline of its own and returns how
// long it took, then releases what it took (untimed).
func acquireTimed(b *testing.B, acquire func(context.Context) (func(context.Context) error, error)) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), benchkit.CallTimeout)
	t0 := time.Now()
	release, err := acquire(ctx)
	took := time.Since(t0)
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), benchkit.CallTimeout)
	defer cancel()
	if err := release(ctx); err != nil {
		b.Fatal(err)
	}
	return took
}

// benchInterleaved rotates the floor's acquire, the token-sized floor's and
// the batch's, call by call (each one first in turn), so that all three meet
// the same moments of a noisy machine, and reports the median of each and
// the batch's ratios to the two floors.
func benchInterleaved(b *testing.B, floor, floorToken, batch func(context.Context) (func(context.Context) error, error)) {
	impls := []func(context.Context) (func(context.Context) error, error){floor, floorToken, batch}
	took := make([][]time.Duration, len(impls))
	for i := 0; b.Loop(); i++ {
		for j := range impls {
			k := (i + j) % len(impls)
			took[k] = append(took[k], acquireTimed(b, impls[k]))
		}
	}
	med := make([]time.Duration, len(impls))
	for k, t := range took {
		slices.Sort(t)
		med[k] = t[len(t)/2]
	}
	b.ReportMetric(float64(med[0].Nanoseconds())/1000, "floor-p50-us")
	b.ReportMetric(float64(med[1].Nanoseconds())/1000, "floor-token-p50-us")
	b.ReportMetric(float64(med[2].Nanoseconds())/1000, "batch10-p50-us")
	b.ReportMetric(float64(med[2])/float64(med[0]), "batch10/floor")
	b.ReportMetric(float64(med[2])/float64(med[1]), "batch10/floor-token")
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
