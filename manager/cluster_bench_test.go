package manager_test

import (
	"context"
	"fmt"
	"math/rand/v2"
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
	floorScript := batchFloorAcquire
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

// benchInterleaved runs the acquires of impls call by call, each round in
// a fresh shuffled order, so that all meet the same moments of a noisy
// machine and each follows every other equally often (what a release
// leaves behind, a GC or a goroutine still winding down, falls on the call
// after it: a fixed rotation would always hand one impl's aftermath to the
// same other). It reports the median of each (<name>-p50-us) and the last
// one's ratios to the others (<last>/<name>).
func benchInterleaved(b *testing.B, names []string, impls ...func(context.Context) (func(context.Context) error, error)) {
	took := make([][]time.Duration, len(impls))
	order := make([]int, len(impls))
	for k := range order {
		order[k] = k
	}
	rng := rand.New(rand.NewPCG(1, 2)) // the same orders in every run
	for b.Loop() {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, k := range order {
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

// BenchmarkBatchAlternating compares batches of 10 co-located resources,
// each a fresh group (as a service locks one order's items after
// another), taken and released from 16 and 64 goroutines, every call with
// its own deadline: one manager against the one-script floor (acquire:
// SET NX PX on each key; release: compare-and-delete of the keys) through
// go-redis's AutoPipeline() on one client, and four managers against it
// on four clients (a fleet). The floor stores a value as long as a
// shardlock token. The two sides alternate (benchkit.AlternateTimed); it
// reports both sides' batches/s (ops/s) and shardlock's ÷ the floor's,
// and the servers' command time per batch of each side and shardlock's ÷
// the floor's.
func BenchmarkBatchAlternating(b *testing.B) {
	for _, target := range benchTargets {
		b.Run(target.name, func(b *testing.B) {
			f := newDefaultsFleet(b, target.client)
			tok := strings.Repeat("t", len(batchToken(b, f.managers[0])))
			// What runs inside the scripts (MSETEX, a first try where the
			// server has it, is counted).
			cmdTime := benchkit.CommandTime(b, f.clients[0], "set", "get", "del", "mget", "exists")
			for _, p := range []struct {
				name   string
				ms     []*manager.Manager
				floors []redis.UniversalClient
			}{
				{"1manager-vs-autopipeline", f.managers[:1], f.aps[:1]},
				{"4managers-vs-4autopipelines", f.managers, f.aps},
			} {
				for _, g := range []int{16, 64, 256} {
					b.Run(fmt.Sprintf("%s/g=%d", p.name, g), func(b *testing.B) {
						benchkit.AlternateTimed(b, g, testenv.Unique("balt"), "shardlock", batchOp(b, p.ms), "floor", batchFloorOp(b, tok, p.floors), cmdTime)
					})
				}
			}
		})
	}
}

// batchParts are the resources of a benchmark's batch, in one group.
var batchParts = []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}

// batchToken returns a token of m (its length is what a floor's value
// copies).
func batchToken(b *testing.B, m *manager.Manager) string {
	l, err := m.TryAcquire(context.Background(), testenv.Unique("tok"))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = l.Release(context.Background()) }()
	return l.Token()
}

// batchOp takes and releases a fresh batch through ms, worker w on
// manager w mod len(ms).
func batchOp(b *testing.B, ms []*manager.Manager) benchkit.Op {
	return func(w int, run string) (time.Duration, error) {
		m := ms[w%len(ms)]
		res := group(b, benchkit.FreshKey(run, w), batchParts...)
		return benchkit.Pair(func(ctx context.Context) (func(context.Context) error, error) {
			l, err := m.TryAcquireBatch(ctx, res)
			if err != nil {
				return nil, err
			}
			return l.Release, nil
		})
	}
}

// The batch floor's scripts: SET NX PX on each key, unchecked (its keys
// are fresh), and compare-and-delete of all the keys (MGET, then one DEL
// when every key holds the value: the release of a batch nobody waits
// for, as shardlock's release script makes it).
var (
	batchFloorAcquire = redis.NewScript(`for i = 1, #KEYS do redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2], 'NX') end return 1`)
	batchFloorRelease = redis.NewScript(`local v = redis.call('MGET', unpack(KEYS)) for i = 1, #KEYS do if v[i] ~= ARGV[1] then return 0 end end redis.call('DEL', unpack(KEYS)) return 1`)
)

// batchFloorOp takes and releases a fresh batch of keys by the floor's
// scripts, storing tok, worker w on client w mod len(cs).
func batchFloorOp(b *testing.B, tok string, cs []redis.UniversalClient) benchkit.Op {
	for _, s := range []*redis.Script{batchFloorAcquire, batchFloorRelease} {
		if err := s.Load(context.Background(), cs[0]).Err(); err != nil {
			b.Fatal(err)
		}
	}
	return func(w int, run string) (time.Duration, error) {
		c := cs[w%len(cs)]
		keys := make([]string, len(batchParts))
		for i, r := range group(b, benchkit.FreshKey(run, w), batchParts...) {
			keys[i], _ = sharding.LockKey("floor:", r)
		}
		return benchkit.Pair(func(ctx context.Context) (func(context.Context) error, error) {
			if err := batchFloorAcquire.EvalSha(ctx, c, keys, tok, 30000).Err(); err != nil {
				return nil, err
			}
			return func(ctx context.Context) error { return batchFloorRelease.EvalSha(ctx, c, keys, tok).Err() }, nil
		})
	}
}
