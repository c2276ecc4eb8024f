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
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/shardlock/shardlock/internal/benchkit"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

var compareAndDelete = rueidis.NewLuaScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// BenchmarkRueidisFloor measures an uncontended acquire+release: the floor
// (SET NX PX, then an EVALSHA compare-and-delete) through a plain rueidis
// client, beside shardlock with its defaults on a go-redis client with
// ContextTimeoutEnabled, every call under its own context.WithTimeout, on
// the standalone server and the cluster, from 1, 16, 64 and 256
// goroutines. Each reports ops/s, the p99 of its acquire step, and the CPU
// time per acquire+release of the benchmark process and of the servers.
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
			servers := benchkit.ServersOf(b, gc)
			m := benchkit.NewManager(b, gc)
			impls := []struct {
				name string
				op   benchkit.Op
			}{
				{"floor-rueidis", rueidisFloor(rc)},
				{"shardlock", benchkit.Managers([]*manager.Manager{m})},
			}
			for _, g := range []int{1, 16, 64, 256} {
				for _, impl := range impls {
					b.Run(fmt.Sprintf("g=%d/%s", g, impl.name), func(b *testing.B) {
						b.ReportAllocs()
						benchkit.Run(b, servers, g, fmt.Sprintf("rue-%d", time.Now().UnixNano()), impl.op)
					})
				}
			}
		})
	}
}

func rueidisFloor(c rueidis.Client) benchkit.Op {
	return func(w int, run string) (time.Duration, error) {
		key, tok := "floor:{"+benchkit.FreshKey(run, w)+"}", fmt.Sprintf("tok-%d-%d", w, time.Now().UnixNano())
		ctx, cancel := context.WithTimeout(context.Background(), benchkit.CallTimeout)
		start := time.Now()
		err := c.Do(ctx, c.B().Set().Key(key).Value(tok).Nx().Px(10*time.Second).Build()).Error()
		d := time.Since(start)
		cancel()
		if err != nil {
			return d, err
		}
		ctx, cancel = context.WithTimeout(context.Background(), benchkit.CallTimeout)
		defer cancel()
		return d, compareAndDelete.Exec(ctx, c, []string{key}, []string{tok}).Error()
	}
}
