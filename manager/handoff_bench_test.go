package manager_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/benchkit"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// commandCalls sums the calls of every command in INFO commandstats over
// the cluster's masters, script-internal commands included (INFO itself
// excluded).
func commandCalls(b *testing.B, c *redis.ClusterClient) int64 {
	b.Helper()
	var mu sync.Mutex
	var total int64
	err := c.ForEachMaster(context.Background(), func(ctx context.Context, n *redis.Client) error {
		info, err := n.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		for _, line := range strings.Split(info, "\n") {
			if !strings.HasPrefix(line, "cmdstat_") || strings.HasPrefix(line, "cmdstat_info:") {
				continue
			}
			if i := strings.Index(line, "calls="); i >= 0 {
				v := line[i+len("calls="):]
				v = v[:strings.IndexByte(v, ',')]
				n, _ := strconv.ParseInt(v, 10, 64)
				mu.Lock()
				total += n
				mu.Unlock()
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return total
}

// BenchmarkContendedHandoff: 16 goroutines over 1, 4 and 16 managers (each
// with its own cluster client, ContextTimeoutEnabled: a fleet of processes)
// take one resource in turn, hold it 1 ms and ask again at once, every call
// with its own deadline. Beside the default (release
// notifications, local queues) runs the polling-only mode with 10 ms
// jittered retries. Beside the commands per acquisition it reports the CPU
// time per acquisition of this process and of the cluster's servers
// (masters and replicas, their idle load included: benchkit.Measure), which
// say what the commands cost.
func BenchmarkContendedHandoff(b *testing.B) {
	addrs := testenv.ClusterAddrs(b)
	admin := testenv.Cluster(b)
	modes := []struct {
		name string
		opts []manager.Option
	}{
		{"notify", nil},
		{"polling", []manager.Option{manager.WithNotifications(false), manager.WithRetry(manager.LinearBackoff(10 * time.Millisecond))}},
	}
	for _, managers := range []int{1, 4, 16} {
		for _, mode := range modes {
			benchHandoff(b, addrs, admin, fmt.Sprintf("managers=%d/%s", managers, mode.name), managers, 16/managers, mode.opts)
		}
	}
}

// benchHandoff runs one split of BenchmarkContendedHandoff.
func benchHandoff(b *testing.B, addrs []string, admin *redis.ClusterClient, name string, managers, perManager int, modeOpts []manager.Option) {
	b.Run(name, func(b *testing.B) {
		var ms []*manager.Manager
		for i := range managers {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
			b.Cleanup(func() { _ = c.Close() })
			opts := append([]manager.Option{manager.WithOwner(fmt.Sprintf("handoff-%d", i)), manager.WithTTL(5 * time.Second)}, modeOpts...)
			ms = append(ms, newManager(b, c, opts...))
		}
		res := testenv.Unique("handoff")
		var (
			next   atomic.Int64
			mu     sync.Mutex
			waits  []time.Duration
			holds  time.Duration // the 1 ms sleeps, as long as they lasted
			counts = make([]int, managers*perManager)
			wg     sync.WaitGroup
		)
		servers := benchkit.ServersOf(b, admin)
		before := commandCalls(b, admin)
		b.ResetTimer()
		measured := benchkit.Measure(servers)
		for g := range managers * perManager {
			m := ms[g%managers]
			wg.Go(func() {
				for next.Add(1) <= int64(b.N) {
					t0 := time.Now()
					// Every call with its own deadline, as a service sets.
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					l, err := m.Acquire(ctx, res)
					cancel()
					w := time.Since(t0)
					if err != nil {
						b.Error(err)
						return
					}
					held := time.Now()
					time.Sleep(time.Millisecond)
					heldFor := time.Since(held)
					ctx, cancel = context.WithTimeout(context.Background(), time.Second)
					_ = l.Release(ctx)
					cancel()
					mu.Lock()
					waits = append(waits, w)
					holds += heldFor
					counts[g]++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		b.StopTimer()
		measured(b, len(waits)) // per acquisition
		calls := commandCalls(b, admin) - before
		slices.Sort(waits)
		pct := func(p float64) float64 {
			return float64(waits[min(len(waits)-1, int(p*float64(len(waits))))].Microseconds()) / 1000
		}
		b.ReportMetric(float64(len(waits))/b.Elapsed().Seconds(), "acq/s")
		b.ReportMetric(pct(0.5), "p50-wait-ms")
		b.ReportMetric(pct(0.99), "p99-wait-ms")
		b.ReportMetric(float64(waits[len(waits)-1].Microseconds())/1000, "max-wait-ms")
		b.ReportMetric(float64(slices.Min(counts)), "min-acq/goroutine")
		b.ReportMetric(float64(slices.Max(counts)), "max-acq/goroutine")
		b.ReportMetric(float64(calls)/float64(len(waits)), "cmds/acq")
		// How long the 1 ms holds lasted: a sleep that other goroutines'
		// network events interrupt ends late (the runtime waits at least
		// a millisecond again for what is left of it).
		b.ReportMetric(float64(holds.Microseconds())/1000/float64(len(waits)), "hold-mean-ms")
		b.ReportMetric(0, "ns/op")
	})
}
