package manager_test

import (
	"cmp"
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

// handoffModes are the modes BenchmarkContendedHandoff compares: the
// default (release notifications, local queues; on Valkey the hand-over in
// the conditional commands), the same by the scripts only, and the
// polling-only mode with 10 ms jittered retries.
var handoffModes = []struct {
	name string
	opts []manager.Option
}{
	{"notify", nil},
	{"notify-scripts", []manager.Option{manager.WithConditionalCommands(false)}},
	{"polling", []manager.Option{manager.WithNotifications(false), manager.WithRetry(manager.LinearBackoff(10 * time.Millisecond))}},
}

// handoffOptions are the options of a manager of BenchmarkContendedHandoff
// in mode: owner i's, the mode's, a TTL of 5 s.
func handoffOptions(mode string, i int) []manager.Option {
	opts := []manager.Option{manager.WithOwner(fmt.Sprintf("handoff-%d", i)), manager.WithTTL(5 * time.Second)}
	for _, md := range handoffModes {
		if md.name == mode {
			opts = append(opts, md.opts...)
		}
	}
	return opts
}

// BenchmarkContendedHandoff: 16 goroutines take one resource in turn, hold
// it 1 ms and ask again at once, every call with its own deadline, in the
// default mode and the polling-only mode. The goroutines are split over 1,
// 4 and 16 managers of this process (each with its own cluster client,
// ContextTimeoutEnabled), and over 4 and 16 processes of one manager each
// (processes=N: child processes of the benchmark, each with its own Go
// runtime, as a fleet's instances are). Beside the waits, it reports the
// hand-over's own time (from a release call to the next hold's start:
// handover-p50-ms, handover-p99-ms) and the release call's part of it
// (release-p50-ms, release-p99-ms), the commands per acquisition and the
// CPU time per acquisition of the clients and of the cluster's servers
// (masters and replicas, their idle load included: benchkit.Measure),
// which say what the commands cost. At 16 managers and at 16 processes it
// also runs the floor of an announced hand-over (managers=16/floor,
// processes=16/floor, see handoffFloorMode): what this machine and server
// allow any design.
func BenchmarkContendedHandoff(b *testing.B) {
	addrs := testenv.ClusterAddrs(b)
	admin := testenv.Cluster(b)
	for _, managers := range []int{1, 4, 16} {
		for _, mode := range handoffModes {
			benchHandoff(b, addrs, admin, fmt.Sprintf("managers=%d/%s", managers, mode.name), managers, 16/managers, mode.name)
		}
	}
	benchHandoffFloor(b, addrs, admin, "managers=16/"+handoffFloorMode)
	for _, procs := range []int{4, 16} {
		for _, mode := range handoffModes {
			benchHandoffFleet(b, addrs, admin, fmt.Sprintf("processes=%d/%s", procs, mode.name), procs, 16/procs, mode.name)
		}
	}
	benchHandoffFleet(b, addrs, admin, "processes=16/"+handoffFloorMode, 16, 1, handoffFloorMode)
}

// handoffTally is what the goroutines of a hand-over run measured: each
// acquisition's wait and, by the wall clock (one machine's, so comparable
// between its processes), when each 1 ms hold began, when its release was
// called and when that call returned.
type handoffTally struct {
	Waits    []time.Duration
	Held     []int64 // Unix nanoseconds
	Freed    []int64 // Unix nanoseconds
	Released []int64 // Unix nanoseconds
}

// handoffLoop is one goroutine of a hand-over run: while more() grants
// another acquisition, it takes res through m, holds it 1 ms and releases
// it, every call with its own deadline, recording into t.
func handoffLoop(m *manager.Manager, res string, more func() bool, t *handoffTally) error {
	for more() {
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		l, err := m.Acquire(ctx, res)
		cancel()
		w := time.Since(t0)
		if err != nil {
			return err
		}
		held := time.Now()
		time.Sleep(time.Millisecond)
		t.Held, t.Freed = append(t.Held, held.UnixNano()), append(t.Freed, time.Now().UnixNano())
		ctx, cancel = context.WithTimeout(context.Background(), time.Second)
		_ = l.Release(ctx)
		t.Released = append(t.Released, time.Now().UnixNano())
		cancel()
		t.Waits = append(t.Waits, w)
	}
	return nil
}

// benchHandoff runs one split of BenchmarkContendedHandoff in this process.
func benchHandoff(b *testing.B, addrs []string, admin *redis.ClusterClient, name string, managers, perManager int, mode string) {
	b.Run(name, func(b *testing.B) {
		var ms []*manager.Manager
		for i := range managers {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
			b.Cleanup(func() { _ = c.Close() })
			ms = append(ms, newManager(b, c, handoffOptions(mode, i)...))
		}
		res := testenv.Unique("handoff")
		var (
			next    atomic.Int64
			tallies = make([]handoffTally, managers*perManager)
			wg      sync.WaitGroup
		)
		servers := benchkit.ServersOf(b, admin)
		before := commandCalls(b, admin)
		b.ResetTimer()
		measured := benchkit.Measure(servers)
		for g := range tallies {
			wg.Go(func() {
				more := func() bool { return next.Add(1) <= int64(b.N) }
				if err := handoffLoop(ms[g%managers], res, more, &tallies[g]); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
		b.StopTimer()
		n := reportHandoff(b, admin, before, tallies)
		measured(b, n) // per acquisition
	})
}

// reportHandoff reports a hand-over run's figures from its goroutines'
// tallies and the masters' command calls since before; it returns the
// number of acquisitions.
func reportHandoff(b *testing.B, admin *redis.ClusterClient, before int64, tallies []handoffTally) int {
	calls := commandCalls(b, admin) - before
	var (
		waits    []time.Duration
		counts   []int
		held     int64     // ns, all holds
		releases []float64 // ms, each Release call
	)
	for _, t := range tallies {
		waits = append(waits, t.Waits...)
		counts = append(counts, len(t.Waits))
		for i := range t.Held {
			held += t.Freed[i] - t.Held[i]
			releases = append(releases, float64(t.Released[i]-t.Freed[i])/1e6)
		}
	}
	if len(waits) == 0 {
		b.Fatal("no acquisition")
	}
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
	// How long the 1 ms holds lasted: a sleep that network events of the
	// same process interrupt ends late (the runtime waits at least a
	// millisecond again for what is left of it).
	b.ReportMetric(float64(held)/1e6/float64(len(waits)), "hold-mean-ms")
	if gaps := handoverGaps(tallies); len(gaps) > 0 {
		b.ReportMetric(gaps[len(gaps)/2], "handover-p50-ms")
		b.ReportMetric(gaps[min(len(gaps)-1, len(gaps)*99/100)], "handover-p99-ms")
	}
	// The hand-over's first part: the releaser's own call, one round trip
	// (the script that hands the lock on and announces it); the rest is
	// the announcement's way to the waiter and its wake-up.
	slices.Sort(releases)
	b.ReportMetric(releases[len(releases)/2], "release-p50-ms")
	b.ReportMetric(releases[min(len(releases)-1, len(releases)*99/100)], "release-p99-ms")
	b.ReportMetric(0, "ns/op")
	return len(waits)
}

// handoverGaps returns, sorted, how long the lock went from one holder to
// the next in a hand-over run, in milliseconds: from each release call to
// the start of the next hold, whichever goroutine or process took it (a
// wait is about 15 of these plus 15 holds).
func handoverGaps(tallies []handoffTally) []float64 {
	type hold struct{ held, freed int64 }
	var holds []hold
	for _, t := range tallies {
		for i := range t.Held {
			holds = append(holds, hold{t.Held[i], t.Freed[i]})
		}
	}
	slices.SortFunc(holds, func(a, b hold) int { return cmp.Compare(a.held, b.held) })
	var gaps []float64
	for i := 1; i < len(holds); i++ {
		gaps = append(gaps, float64(holds[i].held-holds[i-1].freed)/1e6)
	}
	slices.Sort(gaps)
	return gaps
}
