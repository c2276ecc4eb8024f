package manager_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/benchkit"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// benchTargets are the real standalone server and cluster, with clients
// made as a service makes them (ContextTimeoutEnabled).
var benchTargets = []struct {
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

// BenchmarkDefaults measures an uncontended acquire+release the way a
// service makes it: shardlock with its defaults, every call under its own
// context.WithTimeout, go-redis clients with ContextTimeoutEnabled, with
// one manager and with four (a fleet is many processes, each with its own
// client), beside the floor (SET NX PX, then an EVALSHA compare-and-delete,
// on one client) and the same floor through go-redis's AutoPipeline(), on
// one client and on four (the floor of a fleet of four processes), on
// the real standalone server and cluster, from 1, 16, 64 and 256
// goroutines. Each reports ops/s, the p99 of its acquire step, and the CPU
// time per acquire+release of the benchmark process and of the servers.
func BenchmarkDefaults(b *testing.B) {
	for _, target := range benchTargets {
		b.Run(target.name, func(b *testing.B) {
			f := newDefaultsFleet(b, target.client)
			servers := benchkit.ServersOf(b, f.clients[0])
			impls := []struct {
				name string
				op   benchkit.Op
			}{
				{"floor", floorTimed(f.clients[0])},
				{"floor-autopipeline", floorTimed(f.aps[0])},
				{"floor-autopipeline-4clients", floorTimed(f.aps...)},
				{"shardlock", benchkit.Managers(f.managers[:1])},
				{"shardlock-4managers", benchkit.Managers(f.managers)},
			}
			for _, g := range []int{1, 16, 64, 256} {
				for _, impl := range impls {
					b.Run(fmt.Sprintf("g=%d/%s", g, impl.name), func(b *testing.B) {
						b.ReportAllocs()
						benchkit.Run(b, servers, g, testenv.Unique("def"), impl.op)
					})
				}
			}
		})
	}
}

// benchPair is one comparison of BenchmarkDefaultsAlternating: shardlock
// (lock) against a floor, at each goroutine count of gs.
type benchPair struct {
	name  string
	lock  benchkit.Op
	floor benchkit.Op
	gs    []int
}

// BenchmarkDefaultsAlternating is BenchmarkDefaults' comparisons that
// decide whether shardlock keeps up with the floors, each made with the two
// sides alternating in slices of the same run (benchkit.Alternate), so that
// both meet the same moments of a noisy machine: one manager against the
// auto-pipelined floor on one client, four managers against it on four
// clients (a fleet), and at 16 goroutines one manager against the plain
// floor too; on a server with a conditional delete (Valkey 9: DELIFEQ;
// Redis 8: DELEX ... IFEQ), one and four managers against the native
// floor (SET NX PX, the conditional delete) as well. It reports both
// sides' ops/s and shardlock's ÷ the floor's, and the servers' command time
// per acquire+release of each side and shardlock's ÷ the floor's
// (benchkit.CommandTime).
func BenchmarkDefaultsAlternating(b *testing.B) {
	for _, target := range benchTargets {
		b.Run(target.name, func(b *testing.B) {
			f := newDefaultsFleet(b, target.client)
			// GET and DEL run only inside the release scripts here.
			cmdTime := benchkit.CommandTime(b, f.clients[0], "get", "del")
			pairs := []benchPair{
				{"1manager-vs-floor", benchkit.Managers(f.managers[:1]), floorTimed(f.clients[0]), []int{16}},
				{"1manager-vs-autopipeline", benchkit.Managers(f.managers[:1]), floorTimed(f.aps[0]), []int{16, 64, 256}},
				{"4managers-vs-4autopipelines", benchkit.Managers(f.managers), floorTimed(f.aps...), []int{16, 64, 256}},
			}
			if del := condDelOf(b, f.clients[0]); del != "" {
				// Valkey 9, Redis 8: the native floor too (SET NX PX, DELIFEQ or DELEX).
				pairs = append(pairs,
					benchPair{"1manager-vs-native-autopipeline", benchkit.Managers(f.managers[:1]), nativeFloorTimed(del, f.aps[0]), []int{1, 16, 64, 256}},
					benchPair{"4managers-vs-4native-autopipelines", benchkit.Managers(f.managers), nativeFloorTimed(del, f.aps...), []int{1, 16, 64, 256}})
			}
			for _, p := range pairs {
				for _, g := range p.gs {
					b.Run(fmt.Sprintf("%s/g=%d", p.name, g), func(b *testing.B) {
						benchkit.AlternateTimed(b, g, testenv.Unique("alt"), "shardlock", p.lock, "floor", p.floor, cmdTime)
					})
				}
			}
		})
	}
}

// defaultsFleet is what BenchmarkDefaults compares: four clients made as a
// service makes them, each also behind go-redis's AutoPipeline(), and a
// manager with its defaults on four clients of their own (the floors and
// the managers share no connection pool, as two services would not).
type defaultsFleet struct {
	clients, aps []redis.UniversalClient
	managers     []*manager.Manager
}

func newDefaultsFleet(b *testing.B, client func(b *testing.B) redis.UniversalClient) defaultsFleet {
	var f defaultsFleet
	for range 4 {
		c, mc := client(b), client(b)
		b.Cleanup(func() { _ = c.Close(); _ = mc.Close() })
		ap, err := c.AutoPipeline()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = ap.Close() })
		f.clients, f.aps = append(f.clients, c), append(f.aps, ap)
		f.managers = append(f.managers, newManager(b, mc))
	}
	if err := compareAndDelete.Load(context.Background(), f.clients[0]).Err(); err != nil {
		b.Fatal(err)
	}
	return f
}

// BenchmarkDefaultsPaired is BenchmarkDefaults' one-goroutine shape with
// the plain floor and shardlock (its defaults) alternating call by call,
// the order swapped every pair, so that both meet the same moments of a
// noisy machine: the g=1 figures of BenchmarkDefaults come from separate
// seconds, and at one goroutine a second's speed differs more between
// seconds than between the two. It reports each one's ops/s over its own
// summed time, and shardlock's ÷ the floor's: with a deadline per call
// (deadline), and with context.Background() for every call, both sides
// (background).
func BenchmarkDefaultsPaired(b *testing.B) {
	for _, target := range benchTargets {
		for _, cc := range []struct {
			name   string
			newCtx benchkit.CallContext
		}{{"deadline", benchkit.Deadline}, {"background", benchkit.Background}} {
			b.Run(target.name+"/"+cc.name, func(b *testing.B) {
				benchPaired(b, target.client, cc.newCtx)
			})
		}
	}
}

// benchPaired is one of BenchmarkDefaultsPaired's comparisons, on a client
// of client's, each call's context made by newCtx.
func benchPaired(b *testing.B, client func(*testing.B) redis.UniversalClient, newCtx benchkit.CallContext) {
	c := client(b)
	b.Cleanup(func() { _ = c.Close() })
	if err := compareAndDelete.Load(context.Background(), c).Err(); err != nil {
		b.Fatal(err)
	}
	run := testenv.Unique("pair")
	floor, lock := floorWith(newCtx, c), benchkit.ManagersWith(newCtx, []*manager.Manager{newManager(b, c)})
	timed := func(op benchkit.Op) time.Duration {
		start := time.Now()
		if _, err := op(0, run); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var floorTook, lockTook time.Duration
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			floorTook += timed(floor)
			lockTook += timed(lock)
		} else {
			lockTook += timed(lock)
			floorTook += timed(floor)
		}
	}
	b.ReportMetric(float64(b.N)/floorTook.Seconds(), "floor-ops/s")
	b.ReportMetric(float64(b.N)/lockTook.Seconds(), "shardlock-ops/s")
	b.ReportMetric(floorTook.Seconds()/lockTook.Seconds(), "shardlock/floor")
}

// floorTimed is floorOp with a deadline per call, worker w on client w
// mod len(cs).
func floorTimed(cs ...redis.UniversalClient) benchkit.Op { return floorWith(benchkit.Deadline, cs...) }

// nativeFloorTimed is floorTimed releasing with the server's conditional
// delete (del: DELIFEQ on Valkey 9, DELEX ... IFEQ on Redis 8) in place of
// the script: the native floor. The command goes by Process: an
// AutoPipeliner sends what Do is given outside its batches.
func nativeFloorTimed(del string, cs ...redis.UniversalClient) benchkit.Op {
	return floorRelease(benchkit.Deadline, func(ctx context.Context, c redis.UniversalClient, key, tok string) error {
		cmd := redis.NewIntCmd(ctx, "delifeq", key, tok)
		if del == "delex" {
			cmd = redis.NewIntCmd(ctx, "delex", key, "ifeq", tok)
		}
		if err := c.Process(ctx, cmd); err != nil {
			return err
		}
		if cmd.Val() != 1 {
			return fmt.Errorf("floor: %s %s answered %d", del, key, cmd.Val())
		}
		return nil
	}, cs...)
}

// condDelOf returns the conditional delete c's server runs: "delifeq"
// (Valkey 9), else "delex" (Redis 8.4, Valkey 9.2), else "".
func condDelOf(b *testing.B, c redis.UniversalClient) string {
	info, err := c.Do(context.Background(), "command", "info", "delifeq", "delex").Slice()
	if err != nil {
		b.Fatal(err)
	}
	switch {
	case len(info) == 2 && info[0] != nil:
		return "delifeq"
	case len(info) == 2 && info[1] != nil:
		return "delex"
	}
	return ""
}

// floorWith is floorOp with each call's context made by newCtx, worker w
// on client w mod len(cs).
func floorWith(newCtx benchkit.CallContext, cs ...redis.UniversalClient) benchkit.Op {
	return floorRelease(newCtx, func(ctx context.Context, c redis.UniversalClient, key, tok string) error {
		return compareAndDelete.Run(ctx, c, []string{key}, tok).Err()
	}, cs...)
}

// floorRelease is floorWith releasing with release.
func floorRelease(newCtx benchkit.CallContext, release func(ctx context.Context, c redis.UniversalClient, key, tok string) error, cs ...redis.UniversalClient) benchkit.Op {
	return func(w int, run string) (time.Duration, error) {
		c := cs[w%len(cs)]
		key, tok := "floor:{"+benchkit.FreshKey(run, w)+"}", fmt.Sprintf("tok-%d-%d", w, time.Now().UnixNano())
		ctx, cancel := newCtx()
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
		ctx, cancel = newCtx()
		defer cancel()
		return d, release(ctx, c, key, tok)
	}
}
