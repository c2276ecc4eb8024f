package manager_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

func TestRealMulti(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m := newManager(t, c)
		ctx := ctxT(t)
		run := testenv.Unique("multi")
		g := group(t, run+"-g", "x", "y")
		res := append([]string{run + "-a", run + "-b", run + "-c"}, g...)
		ml, err := m.TryAcquireMulti(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		// One lock per slot; the two grouped resources share one.
		slots := map[int]bool{}
		for _, r := range res {
			k, _ := sharding.LockKey(sharding.DefaultPrefix, r)
			slots[sharding.Slot(k)] = true
		}
		if len(ml.Locks()) != len(slots) || len(ml.Resources()) != len(res) {
			t.Fatalf("%d parts for %d slots, %d resources", len(ml.Locks()), len(slots), len(ml.Resources()))
		}
		if err := ml.Release(ctx); err != nil {
			t.Fatal(err)
		}
		// A held resource in the set: all or none, what was taken is rolled back.
		other, err := m.TryAcquire(ctx, res[1])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.TryAcquireMulti(ctx, res); !errors.Is(err, manager.ErrNotAcquired) {
			t.Fatalf("multi over a held resource: %v", err)
		}
		for _, r := range res {
			if r == res[1] {
				continue
			}
			k, _ := sharding.LockKey(sharding.DefaultPrefix, r)
			if c.Exists(ctx, k).Val() != 0 {
				t.Fatalf("%s left held after a failed multi", r)
			}
		}
		_ = other.Release(ctx)
		if _, err := m.TryAcquireMulti(ctx, []string{"a", "a"}); !errors.Is(err, manager.ErrInvalidArgument) {
			t.Fatalf("duplicate: %v", err)
		}
	})
}

// Callers taking overlapping sets in opposite orders never deadlock.
func TestRealMultiNoDeadlock(t *testing.T) {
	addrs := testenv.ClusterAddrs(t)
	run := testenv.Unique("dl")
	sets := [][]string{{run + "-x", run + "-y", run + "-z"}, {run + "-z", run + "-y", run + "-x"}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var done, failed atomic.Int64
	var wg sync.WaitGroup
	for i := range 4 {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { _ = c.Close() })
		m := newManager(t, c, manager.WithRetry(manager.ExponentialBackoff(time.Millisecond, 10*time.Millisecond)))
		for j := range 2 {
			set := sets[(i+j)%2]
			wg.Go(func() {
				for ctx.Err() == nil {
					ml, err := m.AcquireMulti(ctx, set, manager.AcquireWithWait(time.Second))
					if err != nil {
						if ctx.Err() == nil {
							failed.Add(1)
						}
						continue
					}
					time.Sleep(200 * time.Microsecond)
					_ = ml.Release(context.Background())
					done.Add(1)
				}
			})
		}
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d acquisitions gave up within their 1 s wait: a deadlock?", failed.Load())
	}
	if done.Load() < 20 {
		t.Fatalf("only %d acquisitions of overlapping sets in 2 s", done.Load())
	}
	t.Logf("%d acquisitions of overlapping sets by 8 goroutines in 2 s", done.Load())
}
