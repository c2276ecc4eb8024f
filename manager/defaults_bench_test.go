package manager_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// callTimeout is the deadline a service gives each lock call.
const callTimeout = time.Second

// BenchmarkDefaults measures an uncontended acquire+release the way a
// service makes it: shardlock with its defaults, every call under its own
// context.WithTimeout, go-redis clients with ContextTimeoutEnabled, with
// one manager and with four (a fleet is many processes, each with its own
// client), beside the floor (SET NX PX, then an EVALSHA compare-and-delete,
// on one client) and the same floor through go-redis's AutoPipeline(), on
// the real standalone server and cluster, from 1, 16, 64 and 256
// goroutines. Each reports ops/s and the p99 of its acquire step.
func BenchmarkDefaults(b *testing.B) {
	targets := []struct {
		name   string
		client func(b *testing.B) redis.UniversalClient
	}{
		{"standalone", func(b *testing.B) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: testenv.StandaloneAddr(b), ContextTimeoutEnabled: true})
		}},
		{"cluster", func(b *testing.B) redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.ClusterAddrs(b), ContextTimeoutEnabled: true})
		}},
	}
	for _, target := range targets {
		b.Run(target.name, func(b *testing.B) {
			clients := make([]redis.UniversalClient, 4)
			for i := range clients {
				clients[i] = target.client(b)
				b.Cleanup(func() { _ = clients[i].Close() })
			}
			ap, err := clients[0].AutoPipeline()
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = ap.Close() })
			if err := compareAndDelete.Load(context.Background(), clients[0]).Err(); err != nil {
				b.Fatal(err)
			}
			managers := make([]*manager.Manager, len(clients))
			for i, c := range clients {
				managers[i] = newManager(b, c)
			}
			impls := []struct {
				name string
				op   timedOp
			}{
				{"floor", floorTimed(clients[0])},
				{"floor-autopipeline", floorTimed(ap)},
				{"shardlock", managersTimed(managers[:1])},
				{"shardlock-4managers", managersTimed(managers)},
			}
			for _, g := range []int{1, 16, 64, 256} {
				for _, impl := range impls {
					b.Run(fmt.Sprintf("g=%d/%s", g, impl.name), func(b *testing.B) {
						b.ReportAllocs()
						runTimed(b, g, testenv.Unique("def"), impl.op)
					})
				}
			}
		})
	}
}

// timedOp makes one acquire+release for worker w and returns how long its
// acquire step took.
type timedOp func(w int, run string) (time.Duration, error)

// runTimed runs op b.N times in all from g goroutines and reports ops/s and
// the p99 of the acquire step.
func runTimed(b *testing.B, g int, run string, op timedOp) {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		fail atomic.Value
		mu   sync.Mutex
		lat  = make([]time.Duration, 0, b.N)
	)
	b.ResetTimer()
	for w := range g {
		wg.Go(func() {
			mine := make([]time.Duration, 0, b.N/g+1)
			defer func() {
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			}()
			for next.Add(1) <= int64(b.N) {
				d, err := op(w, run)
				if err != nil {
					fail.CompareAndSwap(nil, err)
					return
				}
				mine = append(mine, d)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := fail.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	if len(lat) > 0 {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-acquire-us")
	}
}

// floorTimed is floorOp with a deadline per call.
func floorTimed(c redis.UniversalClient) timedOp {
	return func(w int, run string) (time.Duration, error) {
		key, tok := fmt.Sprintf("floor:{%s-%d}", run, w), fmt.Sprintf("tok-%d-%d", w, time.Now().UnixNano())
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		start := time.Now()
		ok, err := c.SetNX(ctx, key, tok, 10*time.Second).Result()
		d := time.Since(start)
		cancel()
		if err != nil {
			return d, err
		}
		if !ok {
			return d, fmt.Errorf("floor: %s contended", key)
		}
		ctx, cancel = context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		return d, compareAndDelete.Run(ctx, c, []string{key}, tok).Err()
	}
}

// managersTimed takes and releases through the managers, worker w on
// manager w mod len(ms), each call with its own deadline.
func managersTimed(ms []*manager.Manager) timedOp {
	return func(w int, run string) (time.Duration, error) {
		m := ms[w%len(ms)]
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		start := time.Now()
		l, err := m.TryAcquire(ctx, fmt.Sprintf("%s-%d", run, w))
		d := time.Since(start)
		cancel()
		if err != nil {
			return d, err
		}
		ctx, cancel = context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		return d, l.Release(ctx)
	}
}
