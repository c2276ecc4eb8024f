package benchkit

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Servers are the Redis server processes on this machine whose CPU time a
// run reports (server-cpu-us/op), and their read system calls
// (server-reads/op: how many commands a server gets per read, so how big
// the clients' pipelines are). Where the servers and the benchmark share
// the machine's cores and keep them busy, a rate follows the CPU time an
// operation costs in all; the CPU figures say which side of the connection
// that time is spent on. Nil reports none.
type Servers []int

// ServersOf returns the processes of every server c talks to (a cluster's
// masters and replicas), from INFO server, or fails b. The servers must run
// on this machine, as the test servers do.
func ServersOf(b *testing.B, c redis.UniversalClient) Servers {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var (
		mu   sync.Mutex
		pids Servers
	)
	add := func(ctx context.Context, n *redis.Client) error {
		info, err := n.Info(ctx, "server").Result()
		if err != nil {
			return err
		}
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
				pid, err := strconv.Atoi(v)
				if err != nil {
					return err
				}
				mu.Lock()
				pids = append(pids, pid)
				mu.Unlock()
			}
		}
		return nil
	}
	eachServer(b, ctx, c, false, add)
	return pids
}

// eachServer runs fn on every server c talks to (mastersOnly: a cluster's
// masters; else its replicas too), concurrently on a cluster, or fails b.
func eachServer(b *testing.B, ctx context.Context, c redis.UniversalClient, mastersOnly bool, fn func(context.Context, *redis.Client) error) {
	b.Helper()
	var err error
	switch c := c.(type) {
	case *redis.ClusterClient:
		if mastersOnly {
			err = c.ForEachMaster(ctx, fn)
		} else {
			err = c.ForEachShard(ctx, fn)
		}
	case *redis.Client:
		err = fn(ctx, c)
	default:
		b.Fatalf("benchkit: a %T", c)
	}
	if err != nil {
		b.Fatal(err)
	}
}

// usage is what a run reads of the CPU time (user and system) used so far
// by this process and by the servers, and of the servers' read system
// calls; a figure that cannot be read here is not reported.
type usage struct {
	self, srv     time.Duration
	reads         int64
	cpuOK, readOK bool
}

func usageOf(servers Servers) usage {
	var u usage
	u.self, u.cpuOK = selfCPU()
	u.readOK = len(servers) > 0
	for _, pid := range servers {
		t, ok := processCPU(pid)
		u.srv += t
		u.cpuOK = u.cpuOK && ok
		n, ok := processReads(pid)
		u.reads += n
		u.readOK = u.readOK && ok
	}
	return u
}

// Measure starts measuring the CPU time of this process and of servers,
// and the servers' read system calls; the function it returns reports them
// per operation, for n operations since (client-cpu-us/op,
// server-cpu-us/op and server-reads/op, as Run does).
func Measure(servers Servers) (report func(b *testing.B, n int)) {
	u0 := usageOf(servers)
	return func(b *testing.B, n int) { usageOf(servers).report(b, u0, servers, n) }
}

// report reports the figures of a run of n operations from u0 to u.
func (u usage) report(b *testing.B, u0 usage, servers Servers, n int) {
	if u0.cpuOK && u.cpuOK {
		b.ReportMetric(float64((u.self-u0.self).Nanoseconds())/1e3/float64(n), "client-cpu-us/op")
		if len(servers) > 0 {
			b.ReportMetric(float64((u.srv-u0.srv).Nanoseconds())/1e3/float64(n), "server-cpu-us/op")
		}
	}
	if u0.readOK && u.readOK {
		b.ReportMetric(float64(u.reads-u0.reads)/float64(n), "server-reads/op")
	}
}
