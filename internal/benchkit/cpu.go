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
// run reports (server-cpu-us/op). Where the servers and the benchmark
// share the machine's cores and keep them busy, a rate follows the CPU
// time an operation costs in all; the two figures say which side of the
// connection that time is spent on. Nil reports none.
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
	var err error
	switch c := c.(type) {
	case *redis.ClusterClient:
		err = c.ForEachShard(ctx, add)
	case *redis.Client:
		err = add(ctx, c)
	default:
		b.Fatalf("ServersOf: %T", c)
	}
	if err != nil {
		b.Fatal(err)
	}
	return pids
}

// cpuTimes returns the CPU time (user and system) used so far by this
// process and by servers; ok is false where it cannot be read (then
// nothing is reported).
func cpuTimes(servers Servers) (self, srv time.Duration, ok bool) {
	self, ok = selfCPU()
	if !ok {
		return 0, 0, false
	}
	for _, pid := range servers {
		t, ok := processCPU(pid)
		if !ok {
			return 0, 0, false
		}
		srv += t
	}
	return self, srv, true
}
