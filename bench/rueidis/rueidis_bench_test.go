// Package rueidis holds the benchmark that compares shardlock with the
// fastest raw client measured on the project's servers: rueidis, which
// pipelines every command on one connection per node. It is a module of
// its own, so that shardlock's go.mod does not depend on rueidis.
//
//	scripts/redis-test-env.sh up && source .redis-test/env
//	cd bench/rueidis && SHARDLOCK_REQUIRE_REDIS=1 go test -run '^$' -bench . -benchmem
package rueidis

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// callTimeout is the deadline a service gives each lock call.
const callTimeout = time.Second

var compareAndDelete = rueidis.NewLuaScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// BenchmarkRueidisFloor measures an uncontended acquire+release: the floor
// (SET NX PX, then an EVALSHA compare-and-delete) through a plain rueidis
// client, beside shardlock with its defaults on a go-redis client with
// ContextTimeoutEnabled, every call under its own context.WithTimeout, on
// the standalone server and the cluster, from 1, 16, 64 and 256
// goroutines. Each reports ops/s and the p99 of its acquire step.
func BenchmarkRueidisFloor(b *testing.B) {
	targets := []struct {
		name  string
		addrs []string
		gored func() redis.UniversalClient
	}{
		{"standalone", []string{testenv.StandaloneAddr(b)}, func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: testenv.StandaloneAddr(b), ContextTimeoutEnabled: true})
		}},
		{"cluster", testenv.ClusterAddrs(b), func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.ClusterAddrs(b), ContextTimeoutEnabled: true})
		}},
	}
	for _, target := range targets {
		b.Run(target.name, func(b *testing.B) {
			rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: target.addrs, DisableCache: true})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(rc.Close)
			gc := target.gored()
			b.Cleanup(func() { _ = gc.Close() })
			m, err := manager.New(gc)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = m.Close(ctx)
			})
			impls := []struct {
				name string
				op   timedOp
			}{
				{"floor-rueidis", rueidisFloor(rc)},
				{"shardlock", shardlockOp(m)},
			}
			for _, g := range []int{1, 16, 64, 256} {
				for _, impl := range impls {
					b.Run(fmt.Sprintf("g=%d/%s", g, impl.name), func(b *testing.B) {
						b.ReportAllocs()
						runTimed(b, g, fmt.Sprintf("rue-%d", time.Now().UnixNano()), impl.op)
					})
				}
			}
		})
	}
}

// timedOp makes one acquire+release for worker w and returns how long its
// acquire step took.
type timedOp func(w int, run string) (time.Duration, error)

func rueidisFloor(c rueidis.Client) timedOp {
	return func(w int, run string) (time.Duration, error) {
		key, tok := fmt.Sprintf("floor:{%s-%d}", run, w), fmt.Sprintf("tok-%d-%d", w, time.Now().UnixNano())
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		start := time.Now()
		err := c.Do(ctx, c.B().Set().Key(key).Value(tok).Nx().Px(10*time.Second).Build()).Error()
		d := time.Since(start)
		cancel()
		if err != nil {
			return d, err
		}
		ctx, cancel = context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		return d, compareAndDelete.Exec(ctx, c, []string{key}, []string{tok}).Error()
	}
}

func shardlockOp(m *manager.Manager) timedOp {
	return func(w int, run string) (time.Duration, error) {
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
