// Package benchkit holds what the acquire+release benchmarks share: the
// loop that runs an operation from g goroutines and reports ops/s and the
// p99 of its acquire step, and shardlock's side of the operation, made the
// way a service makes it (every call under its own deadline).
package benchkit

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		fail atomic.Value
		mu   sync.Mutex
		lat  = make([]time.Duration, 0, b.N)
	)
	b.ResetTimer()
	measured := Measure(servers)
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
	measured(b, b.N)
	if len(lat) > 0 {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-acquire-us")
	}
}

// Managers takes and releases through ms, worker w on manager w mod
// len(ms), each on a resource of its own, each call with its own deadline.
func Managers(ms []*manager.Manager) Op {
	return func(w int, run string) (time.Duration, error) {
		m := ms[w%len(ms)]
		ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
		start := time.Now()
		l, err := m.TryAcquire(ctx, fmt.Sprintf("%s-%d", run, w))
		d := time.Since(start)
		cancel()
		if err != nil {
			return d, err
		}
		ctx, cancel = context.WithTimeout(context.Background(), CallTimeout)
		defer cancel()
		return d, l.Release(ctx)
	}
}
