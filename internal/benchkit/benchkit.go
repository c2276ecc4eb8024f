// Package benchkit holds what the acquire+release benchmarks share: the
// loop that runs an operation from g goroutines and reports ops/s and the
// p99 of its acquire step, and shardlock's side of the operation, made the
// way a service makes it (every call under its own deadline).
package benchkit

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/manager"
)

// CallTimeout is the deadline a service gives each lock call.
const CallTimeout = time.Second

// Op makes one acquire+release for worker w of the run named run, and
// returns how long its acquire step took.
type Op func(w int, run string) (time.Duration, error)

// Run runs op b.N times in all from g goroutines and reports ops/s, the
// p99 of the acquire step (p99-acquire-us), and the CPU time per operation
// of this process (client-cpu-us/op: the benchmark and everything it
// runs, background goroutines included) and of servers
// (server-cpu-us/op), and the servers' read system calls per operation
// (server-reads/op), where the system reports them.
func Run(b *testing.B, servers Servers, g int, run string, op Op) {
	b.ResetTimer()
	measured := Measure(servers)
	lat, err := runOps(g, b.N, run, op)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	measured(b, b.N)
	if len(lat) > 0 {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-acquire-us")
	}
}

// Alternate compares two operations from g goroutines in the same
// moments of a noisy machine: it runs them in turn, slices slices of
// b.N/slices operations each (at least g), the order swapped every pair
// (A B B A ...), and reports each one's ops/s over its own summed time
// (aName-ops/s, bName-ops/s) and A's rate ÷ B's (aName/bName). Run's
// figures come from separate seconds, between which this machine's speed
// changes by more than the difference between two close implementations.
// It reports no ns/op: its operations are not b.N.
func Alternate(b *testing.B, g int, run string, aName string, a Op, bName string, bOp Op) {
	AlternateTimed(b, g, run, aName, a, bName, bOp, nil)
}

// AlternateTimed is Alternate that also reports, where cmdTime is not nil,
// the servers' command time per operation of each side (aName-cmd-us/op,
// bName-cmd-us/op: cmdTime's growth over that side's slices, see
// CommandTime) and A's ÷ B's (aName/bName-cmd).
func AlternateTimed(b *testing.B, g int, run string, aName string, a Op, bName string, bOp Op, cmdTime func() time.Duration) {
	const slices = 10
	per := max(b.N/slices, g)
	var took, cmd [2]time.Duration
	ops := [2]Op{a, bOp}
	b.ResetTimer()
	for i := range slices {
		for _, j := range [2][2]int{{0, 1}, {1, 0}}[i%2] {
			var c0 time.Duration
			if cmdTime != nil {
				b.StopTimer()
				c0 = cmdTime()
				b.StartTimer()
			}
			start := time.Now()
			if _, err := runOps(g, per, run, ops[j]); err != nil {
				b.Fatal(err)
			}
			took[j] += time.Since(start)
			if cmdTime != nil {
				b.StopTimer()
				cmd[j] += cmdTime() - c0
				b.StartTimer()
			}
		}
	}
	b.StopTimer()
	n := float64(per * slices)
	b.ReportMetric(n/took[0].Seconds(), aName+"-ops/s")
	b.ReportMetric(n/took[1].Seconds(), bName+"-ops/s")
	b.ReportMetric(took[1].Seconds()/took[0].Seconds(), aName+"/"+bName)
	if cmdTime != nil && cmd[1] > 0 {
		b.ReportMetric(float64(cmd[0].Microseconds())/n, aName+"-cmd-us/op")
		b.ReportMetric(float64(cmd[1].Microseconds())/n, bName+"-cmd-us/op")
		b.ReportMetric(cmd[0].Seconds()/cmd[1].Seconds(), aName+"/"+bName+"-cmd")
	}
	b.ReportMetric(0, "ns/op") // suppresses it (see testing.B.ReportMetric)
}

// runOps runs op n times in all from g goroutines, worker w as op's w,
// and returns the durations of the acquire steps, or the first error.
func runOps(g, n int, run string, op Op) ([]time.Duration, error) {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		fail atomic.Value
		mu   sync.Mutex
		lat  = make([]time.Duration, 0, n)
	)
	for w := range g {
		wg.Go(func() {
			mine := make([]time.Duration, 0, n/g+1)
			defer func() {
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			}()
			for next.Add(1) <= int64(n) {
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
	err, _ := fail.Load().(error)
	return lat, err
}

// seq numbers the keys FreshKey makes.
var seq atomic.Uint64

// FreshKey returns a name that no call used before, for worker w of the
// run named run: a service locks one order, job or user after another,
// each on its own slot of a cluster, never the same key in a loop.
func FreshKey(run string, w int) string {
	return run + "-" + strconv.Itoa(w) + "-" + strconv.FormatUint(seq.Add(1), 36)
}

// A CallContext makes the context of one lock call.
type CallContext func() (context.Context, context.CancelFunc)

// Deadline gives a call a deadline of its own, CallTimeout away, as a
// service does.
func Deadline() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), CallTimeout)
}

// Background gives a call context.Background(), as code that sets no
// deadlines does.
func Background() (context.Context, context.CancelFunc) {
	return context.Background(), func() {}
}

// Managers takes and releases through ms, worker w on manager w mod
// len(ms), each time on a fresh resource (FreshKey), each call with its own
// deadline.
func Managers(ms []*manager.Manager) Op { return ManagersWith(Deadline, ms) }

// ManagersWith is Managers with each call's context made by newCtx.
func ManagersWith(newCtx CallContext, ms []*manager.Manager) Op {
	return func(w int, run string) (time.Duration, error) {
		m := ms[w%len(ms)]
		ctx, cancel := newCtx()
		start := time.Now()
		l, err := m.TryAcquire(ctx, FreshKey(run, w))
		d := time.Since(start)
		cancel()
		if err != nil {
			return d, err
		}
		ctx, cancel = newCtx()
		defer cancel()
		return d, l.Release(ctx)
	}
}

// NewManager makes a Manager on c with opts for a benchmark's run, closed
// when b ends, or fails b.
func NewManager(b testing.TB, c redis.UniversalClient, opts ...manager.Option) *manager.Manager {
	b.Helper()
	m, err := manager.New(context.Background(), c, opts...)
	if err != nil {
		b.Fatalf("New: %v", err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = m.Close(ctx)
	})
	return m
}

// Pair makes one acquire+release the way a service does, each call under
// its own deadline of CallTimeout: acquire, which returns the release, and
// then that. It returns how long the acquire took, and the first error.
func Pair(acquire func(ctx context.Context) (release func(context.Context) error, err error)) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	start := time.Now()
	release, err := acquire(ctx)
	d := time.Since(start)
	cancel()
	if err != nil {
		return d, err
	}
	ctx, cancel = context.WithTimeout(context.Background(), CallTimeout)
	defer cancel()
	return d, release(ctx)
}
