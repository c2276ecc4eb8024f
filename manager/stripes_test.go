package manager_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/slotmap"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

func TestAcquireStripe(t *testing.T) {
	_, c := miniClient(t)
	m := newManager(t, c)
	ctx := ctxT(t)
	l, err := m.AcquireStripe(ctx, "order:hot", 8, "customer-42")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("order:hot#%d", sharding.StripeIndex("customer-42", 8)); l.Resource() != want {
		t.Fatalf("stripe %q, want %q", l.Resource(), want)
	}
	// Another partition of the same stripe waits; one of another stripe does not.
	other := "customer-0"
	for i := 0; sharding.StripeIndex(other, 8) == sharding.StripeIndex("customer-42", 8); i++ {
		other = fmt.Sprintf("customer-%d", i)
	}
	if _, err := m.AcquireStripe(ctx, "order:hot", 8, other); err != nil {
		t.Fatalf("a partition of another stripe: %v", err)
	}
	for _, tt := range []struct {
		res string
		n   int
	}{{"order:hot", 0}, {"order:hot", manager.MaxStripes + 1}, {"{tag}:hot", 8}, {"", 8}} {
		if _, err := m.AcquireStripe(ctx, tt.res, tt.n, "p"); !errors.Is(err, manager.ErrInvalidArgument) {
			t.Errorf("AcquireStripe(%q, %d) = %v", tt.res, tt.n, err)
		}
		if _, err := m.AcquireAny(ctx, tt.res, tt.n); !errors.Is(err, manager.ErrInvalidArgument) {
			t.Errorf("AcquireAny(%q, %d) = %v", tt.res, tt.n, err)
		}
	}
	if _, err := m.AcquireAny(ctx, "r", -5); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Errorf("AcquireAny(-5) = %v", err)
	}
}

func TestAcquireAnyPool(t *testing.T) {
	_, c := miniClient(t)
	m := newManager(t, c, manager.WithRetry(manager.LinearBackoff(2*time.Millisecond)))
	ctx := ctxT(t)
	seen := map[string]bool{}
	var held []*manager.Lock
	for range 3 {
		l, err := m.AcquireAny(ctx, "pool", 3)
		if err != nil {
			t.Fatal(err)
		}
		seen[l.Resource()] = true
		held = append(held, l)
	}
	if len(seen) != 3 {
		t.Fatalf("3 permits taken as %v", seen)
	}
	if _, err := m.AcquireAny(ctx, "pool", 3, manager.WithWait(20*time.Millisecond)); !errors.Is(err, manager.ErrNotAcquired) {
		t.Fatalf("a fourth holder: %v", err)
	}
	_ = held[1].Release(ctx)
	l, err := m.AcquireAny(ctx, "pool", 3)
	if err != nil || l.Resource() != held[1].Resource() {
		t.Fatalf("after a release: %v, %v", l.Resource(), err)
	}
}

// 8 stripes of a resource spread over all 3 masters for most resources.
func TestRealStripesSpreadOverMasters(t *testing.T) {
	c := testenv.Cluster(t)
	slots, err := slotmap.Read(ctxT(t), c)
	if err != nil {
		t.Fatal(err)
	}
	masterOf := func(slot int) string {
		r, _ := slots.Of(slot)
		return r.Master
	}
	all := 0
	const resources = 200
	for r := range resources {
		masters := map[string]bool{}
		for i := range 8 {
			name, _ := sharding.StripeResource(fmt.Sprintf("order:%d", r), 8, i)
			key, _ := sharding.LockKey(sharding.DefaultPrefix, name)
			masters[masterOf(sharding.Slot(key))] = true
		}
		if len(masters) == 3 {
			all++
		}
	}
	// With 8 stripes on 3 equal masters, about 88% of resources touch all three.
	if all < resources*8/10 {
		t.Fatalf("only %d of %d resources have stripes on all 3 masters", all, resources)
	}
	t.Logf("%d of %d resources have their 8 stripes on all 3 masters", all, resources)
}

// The pool never has more than N holders, and a permit never two: 4
// managers x 4 goroutines on a pool of 3 on the real cluster.
func TestRealPoolNeverOverflows(t *testing.T) {
	addrs := testenv.ClusterAddrs(t)
	const permits = 3
	pool := testenv.Unique("pool")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var (
		holders, maxHolders, sections atomic.Int64
		perPermit                     sync.Map // resource -> *atomic.Int64
		wg                            sync.WaitGroup
	)
	for i := range 4 {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { _ = c.Close() })
		m := newManager(t, c, manager.WithTTL(time.Second), manager.WithOwner(fmt.Sprintf("pool-%d", i)),
			manager.WithRetry(manager.ExponentialBackoff(time.Millisecond, 10*time.Millisecond)))
		for range 4 {
			wg.Go(func() {
				for ctx.Err() == nil {
					l, err := m.AcquireAny(ctx, pool, permits)
					if err != nil {
						if ctx.Err() == nil {
							t.Error(err)
						}
						return
					}
					n := holders.Add(1)
					for {
						old := maxHolders.Load()
						if n <= old || maxHolders.CompareAndSwap(old, n) {
							break
						}
					}
					v, _ := perPermit.LoadOrStore(l.Resource(), new(atomic.Int64))
					if v.(*atomic.Int64).Add(1) != 1 {
						t.Errorf("permit %s held twice", l.Resource())
					}
					time.Sleep(time.Millisecond)
					v.(*atomic.Int64).Add(-1)
					holders.Add(-1)
					sections.Add(1)
					_ = l.Release(context.Background())
				}
			})
		}
	}
	wg.Wait()
	if maxHolders.Load() > permits {
		t.Fatalf("%d holders at once, pool of %d", maxHolders.Load(), permits)
	}
	if sections.Load() < 50 {
		t.Fatalf("only %d sections", sections.Load())
	}
	t.Logf("%d sections, at most %d holders at once", sections.Load(), maxHolders.Load())
}

// AcquireAny finds the free permit with one read per node: 8 permits on
// the cluster with 7 held cost at most 3 pipelines (the read) and one SET.
func TestRealAcquireAnyRoundTrips(t *testing.T) {
	c, trips := countingCluster(t)
	m := newManager(t, c)
	ctx := ctxT(t)
	pool := testenv.Unique("anyrt")
	const permits = 8
	var held []*manager.Lock
	for range permits - 1 {
		l, err := m.AcquireAny(ctx, pool, permits)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	trips.Store(0)
	l, err := m.AcquireAny(ctx, pool, permits)
	if err != nil {
		t.Fatal(err)
	}
	if got := trips.Load(); got > 4 {
		t.Fatalf("the last free permit of %d took %d round trips", permits, got)
	}
	for _, h := range held {
		if h.Resource() == l.Resource() {
			t.Fatalf("permit %s taken twice", l.Resource())
		}
	}
	// All taken: a try reads and gives up, with no attempt.
	trips.Store(0)
	if _, err := m.TryAcquireAny(ctx, pool, permits); !errors.Is(err, manager.ErrNotAcquired) {
		t.Fatalf("full pool: %v", err)
	}
	if got := trips.Load(); got > 3 {
		t.Fatalf("a full pool of %d took %d round trips", permits, got)
	}
}

// The Try forms make one attempt (one round for permits) and never wait,
// whatever the wait limit.
func TestTryAcquireStripeAndAny(t *testing.T) {
	_, c := miniClient(t)
	m := newManager(t, c, manager.WithWait(time.Minute))
	ctx := ctxT(t)
	l, err := m.TryAcquireStripe(ctx, "order:hot", 8, "customer-42")
	if err != nil || l.Resource() != fmt.Sprintf("order:hot#%d", sharding.StripeIndex("customer-42", 8)) {
		t.Fatalf("TryAcquireStripe = %v, %v", l.Resource(), err)
	}
	start := time.Now()
	if _, err := m.TryAcquireStripe(ctx, "order:hot", 8, "customer-42"); !errors.Is(err, manager.ErrNotAcquired) {
		t.Fatalf("a held stripe: %v", err)
	}
	var held []*manager.Lock
	for range 2 {
		p, err := m.TryAcquireAny(ctx, "pool", 2)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	if _, err := m.TryAcquireAny(ctx, "pool", 2); !errors.Is(err, manager.ErrNotAcquired) {
		t.Fatalf("a third holder of 2 permits: %v", err)
	}
	if waited := time.Since(start); waited > 30*time.Second {
		t.Fatalf("the Try forms waited %v", waited) // the wait limit is a minute
	}
	if _, err := m.TryAcquireAny(ctx, "pool", 0); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("TryAcquireAny(0) = %v", err)
	}
	for _, p := range append(held, l) {
		_ = p.Release(ctx)
	}
}
