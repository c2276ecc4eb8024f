// Package peers holds the benchmark that compares shardlock with the Go
// lock libraries users weigh it against: redsync, bsm/redislock and
// rueidislock, each at its defaults, on the project's real servers (Redis
// or Valkey, whichever scripts/redis-test-env.sh started). It is a module
// of its own, so that shardlock's go.mod depends on none of them.
//
//	scripts/redis-test-env.sh up && source .redis-test/env
//	cd bench/peers && SHARDLOCK_REQUIRE_REDIS=1 go test -run '^$' -bench . -benchtime 20000x
package peers

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	"github.com/shardlock/shardlock/internal/benchkit"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// lockTTL is the TTL given to the libraries that take one per call
// (bsm/redislock); the others use their defaults (redsync 8 s, rueidislock
// 5 s, shardlock 30 s).
const lockTTL = 10 * time.Second

// target is a real server the benchmark runs on, with clients made as a
// service makes them (go-redis with ContextTimeoutEnabled).
type target struct {
	name  string
	addrs []string
	gored func() redis.UniversalClient
}

func targets(b *testing.B) []target {
	return []target{
		{"standalone", []string{testenv.StandaloneAddr(b)}, func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: testenv.StandaloneAddr(b), ContextTimeoutEnabled: true})
		}},
		{"cluster", testenv.ClusterAddrs(b), func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.ClusterAddrs(b), ContextTimeoutEnabled: true})
		}},
	}
}

// peer makes a library's acquire+release operation over n instances (a
// fleet of n processes: worker w uses instance w mod n).
type peer struct {
	name string
	make func(b *testing.B, t target, n int) benchkit.Op
}

var peers = []peer{
	{"redsync", redsyncOp},
	{"redislock", redislockOp},
	{"rueidislock", rueidislockOp},
}

// BenchmarkPeers measures an uncontended acquire+release of a fresh
// resource by shardlock (its defaults) against each peer library (its
// defaults), the two alternating in slices of the same run
// (benchkit.Alternate), every call under its own context.WithTimeout: one
// instance of each (one Manager, one redsync, ...) and four (a fleet), from
// 1, 16, 64 and 256 goroutines, on the standalone server and the cluster.
// It reports both sides' ops/s and shardlock's ÷ the peer's.
func BenchmarkPeers(b *testing.B) {
	for _, t := range targets(b) {
		b.Run(t.name, func(b *testing.B) {
			for _, n := range []int{1, 4} {
				lock := shardlockOp(b, t, n)
				for _, p := range peers {
					op := p.make(b, t, n)
					for _, g := range []int{1, 16, 64, 256} {
						b.Run(fmt.Sprintf("%dx-%s/g=%d", n, p.name, g), func(b *testing.B) {
							benchkit.Alternate(b, g, fmt.Sprintf("peers-%d", time.Now().UnixNano()), "shardlock", lock, p.name, op)
						})
					}
				}
			}
		})
	}
}

// clients makes n go-redis clients of t, closed at the end of b.
func clients(b *testing.B, t target, n int) []redis.UniversalClient {
	cs := make([]redis.UniversalClient, n)
	for i := range cs {
		cs[i] = t.gored()
		c := cs[i]
		b.Cleanup(func() { _ = c.Close() })
	}
	return cs
}

func shardlockOp(b *testing.B, t target, n int) benchkit.Op {
	var ms []*manager.Manager
	for _, c := range clients(b, t, n) {
		ms = append(ms, benchkit.NewManager(b, c))
	}
	return benchkit.Managers(ms)
}

func redsyncOp(b *testing.B, t target, n int) benchkit.Op {
	var rs []*redsync.Redsync
	for _, c := range clients(b, t, n) {
		rs = append(rs, redsync.New(redsyncgoredis.NewPool(c)))
	}
	return func(w int, run string) (time.Duration, error) {
		mu := rs[w%len(rs)].NewMutex("redsync:{" + benchkit.FreshKey(run, w) + "}")
		return benchkit.Pair(func(ctx context.Context) (func(context.Context) error, error) {
			return func(ctx context.Context) error {
				ok, err := mu.UnlockContext(ctx)
				if err == nil && !ok {
					err = fmt.Errorf("redsync: unlock of %s did nothing", mu.Name())
				}
				return err
			}, mu.LockContext(ctx)
		})
	}
}

func redislockOp(b *testing.B, t target, n int) benchkit.Op {
	var ls []*redislock.Client
	for _, c := range clients(b, t, n) {
		ls = append(ls, redislock.New(c))
	}
	return func(w int, run string) (time.Duration, error) {
		return benchkit.Pair(func(ctx context.Context) (func(context.Context) error, error) {
			l, err := ls[w%len(ls)].Obtain(ctx, "redislock:{"+benchkit.FreshKey(run, w)+"}", lockTTL, nil)
			if err != nil {
				return nil, err
			}
			return l.Release, nil
		})
	}
}

func rueidislockOp(b *testing.B, t target, n int) benchkit.Op {
	var ls []rueidislock.Locker
	for range n {
		l, err := rueidislock.NewLocker(rueidislock.LockerOption{ClientOption: rueidis.ClientOption{InitAddress: t.addrs}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(l.Close)
		ls = append(ls, l)
	}
	return func(w int, run string) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), benchkit.CallTimeout)
		defer cancel()
		start := time.Now()
		_, release, err := ls[w%len(ls)].WithContext(ctx, "rueidislock-"+benchkit.FreshKey(run, w))
		d := time.Since(start)
		if err != nil {
			return d, err
		}
		release() // deletes the keys and waits for it
		return d, nil
	}
}
