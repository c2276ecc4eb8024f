package manager_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardlock/shardlock/internal/benchkit"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// BenchmarkReadWrite measures read acquisitions of a read-write lock
// against the exclusive lock's, with defaults, every call under its own
// context.WithTimeout and go-redis clients with ContextTimeoutEnabled, on
// one manager and on four, on the real standalone server and cluster, from
// 16 and 64 goroutines:
//   - shared: every goroutine takes the same resource and holds it for
//     hold (0 or 1 ms) before it releases: AcquireRead lets them all in at
//     once, Acquire one at a time;
//   - own: each goroutine takes a resource of its own (the read-write
//     lock's script against the exclusive lock's SET NX).
//
// Each reports ops/s (acquire, hold, release), the p99 of the acquire step,
// and the CPU time per operation of the benchmark process and the servers.
func BenchmarkReadWrite(b *testing.B) {
	for _, target := range benchTargets {
		b.Run(target.name, func(b *testing.B) {
			managers := make([]*manager.Manager, 4)
			for i := range managers {
				c := target.client(b)
				b.Cleanup(func() { _ = c.Close() })
				managers[i] = newManager(b, c, manager.WithOwner(fmt.Sprintf("bench-%d", i)))
			}
			c := target.client(b)
			b.Cleanup(func() { _ = c.Close() })
			servers := benchkit.ServersOf(b, c)
			for _, shape := range []struct {
				name   string
				shared bool
				hold   time.Duration
			}{{"shared-hold=0", true, 0}, {"shared-hold=1ms", true, time.Millisecond}, {"own", false, 0}} {
				for _, g := range []int{16, 64} {
					for _, n := range []int{1, 4} {
						for _, kind := range []string{"exclusive", "read"} {
							b.Run(fmt.Sprintf("%s/g=%d/managers=%d/%s", shape.name, g, n, kind), func(b *testing.B) {
								benchkit.Run(b, servers, g, testenv.Unique("rwb"), rwOp(managers[:n], kind == "read", shape.shared, shape.hold))
							})
						}
					}
				}
			}
		})
	}
}

// rwOp takes and releases a lock through ms (worker w on manager w mod
// len(ms)), a reader's share or the exclusive lock, on the run's one
// resource (shared) or on one per worker, holding it for hold.
func rwOp(ms []*manager.Manager, read, shared bool, hold time.Duration) benchkit.Op {
	return func(w int, run string) (time.Duration, error) {
		m := ms[w%len(ms)]
		res := run
		if !shared {
			res = fmt.Sprintf("%s-%d", run, w)
		}
		acquire := m.Acquire
		if read {
			acquire = m.AcquireRead
		}
		ctx, cancel := context.WithTimeout(context.Background(), benchkit.CallTimeout)
		start := time.Now()
		l, err := acquire(ctx, res)
		d := time.Since(start)
		cancel()
		if err != nil {
			return d, err
		}
		if hold > 0 {
			time.Sleep(hold)
		}
		ctx, cancel = context.WithTimeout(context.Background(), benchkit.CallTimeout)
		defer cancel()
		return d, l.Release(ctx)
	}
}
