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
// resources, on the standalone server and on the cluster, one goroutine: acquire+release, and the
// acquire alone (the release outside the timer). Beside the acquire, the
// floor of any one-script batch on this Redis: a script that only runs
// SET NX PX on each of the 10 keys (each key needs its own expiry, and
// Redis 7.0 has no command that sets one on several keys), sent by the
// same client, its keys deleted outside the timer; acquire/interleaved
// rotates it, the same floor storing a value as long as a shardlock token
// (floor-token: what the token's size costs the server), the batch by its
// script alone (batch10-scripts: on a server with MSETEX the batch's first
// try is that command) and the batch, call by call, and reports their
// medians and the batch's ratios to the others.
// Every call has its own deadline, and the client has
// ContextTimeoutEnabled.
func BenchmarkBatch(b *testing.B) {
	for _, target := range benchTargets {
		b.Run(target.name, func(b *testing.B) { benchBatch(b, target.client(b)) })
	}
}

// benchBatch is BenchmarkBatch on the server behind c.
func benchBatch(b *testing.B, c redis.UniversalClient) {
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
	// The acquires of the two floors and of the batch both ways, call by call.
	// The batch by its script alone (a Manager with
	// WithConditionalCommands(false): the same as the batch where the
	// servers have no MSETEX).
	sm := newManager(b, c, manager.WithConditionalCommands(false))
	batchScripts := func(ctx context.Context) (func(context.Context) error, error) {
		l, err := sm.TryAcquireBatch(ctx, res)
		return l.Release, err
	}
	b.Run("acquire/interleaved", func(b *testing.B) {
		benchInterleaved(b, []string{"floor", "floor-token", "batch10-scripts", "batch10"}, floor, floorWith(tokenLong), batchScripts, batch)
	})
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

// benchInterleaved rotates the acquires of impls, call by call (each one
// first in turn), so that all meet the same moments of a noisy machine,
// and reports the median of each (<name>-p50-us) and the last one's ratios
// to the others (<last>/<name>).
func benchInterleaved(b *testing.B, names []string, impls ...func(context.Context) (func(context.Context) error, error)) {
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
	last := len(impls) - 1
	for k := range impls {
		b.ReportMetric(float64(med[k].Nanoseconds())/1000, names[k]+"-p50-us")
		if k != last {
			b.ReportMetric(float64(med[last])/float64(med[k]), names[last]+"/"+names[k])
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
