package manager_test

import (
	"context"
	"errors"
	"slices"
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
		// What a Lock tells its holder, a MultiLock tells too.
		keys := ml.Keys()
		if len(keys) != len(res) || ml.Fences() != nil {
			t.Fatalf("%d keys for %d resources, fences %v without fencing", len(keys), len(res), ml.Fences())
		}
		for i, r := range ml.Resources() {
			if k, _ := sharding.LockKey(sharding.DefaultPrefix, r); keys[i] != k || c.Exists(ctx, k).Val() != 1 {
				t.Fatalf("key %d is %q, resource %q", i, keys[i], r)
			}
		}
		if ttl, err := ml.TTL(ctx); err != nil || ttl <= 0 || ttl > manager.DefaultTTL {
			t.Fatalf("TTL = %v, %v", ttl, err)
		}
		select {
		case <-ml.Done():
			t.Fatal("Done closed while held")
		default:
		}
		if err := ml.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ml.Done():
		default:
			t.Fatal("Done open after Release")
		}
		fenced, err := m.TryAcquireMulti(ctx, res, manager.WithFencing(true))
		if err != nil {
			t.Fatal(err)
		}
		if f := fenced.Fences(); len(f) != len(res) || slices.Contains(f, 0) {
			t.Fatalf("fences %v for %d resources", f, len(res))
		}
		if err := fenced.Release(ctx); err != nil {
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
					ml, err := m.AcquireMulti(ctx, set, manager.WithWait(time.Second))
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

// A multi-slot lock is taken and released with one pipeline per node: 12
// resources in 12 slots over 3 masters cost at most 3 round trips each way.
func TestRealMultiPipelinedPerNode(t *testing.T) {
	c, trips := countingCluster(t)
	m := newManager(t, c)
	ctx := ctxT(t)
	run := testenv.Unique("pipe")
	var res []string
	slots := map[int]bool{}
	for i := 0; len(res) < 12; i++ {
		r := run + "-" + string(rune('a'+i))
		k, _ := sharding.LockKey(sharding.DefaultPrefix, r)
		if !slots[sharding.Slot(k)] {
			slots[sharding.Slot(k)] = true
			res = append(res, r)
		}
	}
	// Warm up: the client loads its slot map and dials its connections
	// (HELLO, CLIENT SETINFO) on first use.
	warm, err := m.TryAcquireMulti(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	trips.Store(0)
	ml, err := m.TryAcquireMulti(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	if got := trips.Load(); got > 3 {
		t.Fatalf("acquire of 12 slots took %d round trips", got)
	}
	if len(ml.Locks()) != 12 {
		t.Fatalf("%d parts", len(ml.Locks()))
	}
	trips.Store(0)
	if err := ml.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := trips.Load(); got > 3 {
		t.Fatalf("release of 12 slots took %d round trips", got)
	}
	for _, r := range res {
		k, _ := sharding.LockKey(sharding.DefaultPrefix, r)
		if c.Exists(ctx, k).Val() != 0 {
			t.Fatalf("%s still held after release", r)
		}
	}
	if err := ml.Release(ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}

	// A busy group in the middle: the waiting acquire keeps the groups
	// before it, gives back the rest, and has everything once it is free.
	other := newManager(t, c)
	busy, err := other.TryAcquire(ctx, res[6])
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var held *manager.MultiLock
	go func() {
		var err error
		held, err = m.AcquireMulti(ctx, res)
		got <- err
	}()
	eventually(t, 5*time.Second, "waiter queued on the busy resource", func() bool {
		return c.LLen(ctx, sharding.QueueKey(busy.Key())).Val() > 0 || c.Exists(ctx, busy.Key()).Val() == 1
	})
	if err := busy.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if len(held.Resources()) != len(res) {
		t.Fatalf("%d resources held", len(held.Resources()))
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
