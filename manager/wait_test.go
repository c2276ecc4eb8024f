package manager_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/metrics"
	"github.com/shardlock/shardlock/sharding"
)

// A waiter wakes on the release notification, not on its (5 s) poll timer.
func TestRealWaiterWakesOnRelease(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m := newManager(t, c, manager.WithOwner("waiter"), manager.WithRetry(manager.LinearBackoff(5*time.Second)))
		ctx := ctxT(t)
		res := testenv.Unique("wake")
		holder, err := m.TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		got := acquiredAt(ctx, t, m, res)
		// Release once the waiter listens on its hand-over channel.
		ch := sharding.HandoverChannel(holder.Key(), "waiter")
		eventually(t, 5*time.Second, "waiter subscribed", func() bool {
			return c.PubSubShardNumSub(ctx, ch).Val()[ch] > 0
		})
		released := time.Now()
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		at := <-got
		if at.IsZero() {
			return
		}
		if waited := at.Sub(released); waited > 2*time.Second {
			t.Fatalf("waiter took %v after the release: it polled instead of waking", waited)
		} else {
			t.Logf("waiter acquired %v after the release", waited)
		}
	})
}

// TestRealWaiterHearsAfterConnectionsDrop: a waiter whose connections
// all drop (its sharded pub/sub connection too) is subscribed again on a
// new connection and hears the release, long before its 5 s re-check.
func TestRealWaiterHearsAfterConnectionsDrop(t *testing.T) {
	for _, target := range testenv.CuttableTargets() {
		t.Run(target.Name, func(t *testing.T) {
			var cut, other testenv.Cutter
			c := target.Client(t, &other)
			holderM := newManager(t, c)
			m := newManager(t, target.Client(t, &cut), manager.WithOwner("waiter"), manager.WithRetry(manager.LinearBackoff(5*time.Second)))
			ctx := ctxT(t)
			res := testenv.Unique("drop")
			holder, err := holderM.TryAcquire(ctx, res)
			if err != nil {
				t.Fatal(err)
			}
			got := acquiredAt(ctx, t, m, res)
			ch := sharding.HandoverChannel(holder.Key(), "waiter")
			subscribed := func() bool { return c.PubSubShardNumSub(ctx, ch).Val()[ch] > 0 }
			eventually(t, 5*time.Second, "waiter subscribed", subscribed)
			dials := cut.Dials()
			cut.Drop()
			// The subscription connection dials again (nothing else of the
			// waiter's does before the release) and subscribes again.
			eventually(t, 5*time.Second, "waiter subscribed again", func() bool { return cut.Dials() > dials && subscribed() })
			released := time.Now()
			if err := holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if waited := (<-got).Sub(released); waited > 2*time.Second {
				t.Fatalf("waiter took the lock %v after the release: it did not hear it", waited)
			}
		})
	}
}

// acquiredAt makes m's Acquire of res in the background and sends when it
// returned the lock (zero on an error, reported on t), releasing it.
func acquiredAt(ctx context.Context, t *testing.T, m *manager.Manager, res string) <-chan time.Time {
	got := make(chan time.Time, 1)
	go func() {
		l, err := m.Acquire(ctx, res)
		if err != nil {
			t.Error(err)
			got <- time.Time{}
			return
		}
		got <- time.Now()
		_ = l.Release(ctx)
	}()
	return got
}

func TestMaxLocalWaiters(t *testing.T) {
	_, c := miniClient(t)
	reg := prometheus.NewRegistry()
	mx, _ := metrics.New(reg, metrics.Options{})
	m := newManager(t, c, manager.WithMetrics(mx), manager.WithMaxLocalWaiters(2),
		manager.WithRetry(manager.LinearBackoff(5*time.Millisecond)))
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	holder, err := m.TryAcquire(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { _, _ = m.Acquire(ctx, "r") })
		eventually(t, 5*time.Second, "waiter counted", func() bool {
			return series(t, reg, metrics.Waiters, metrics.ClassDefault) == float64(i+1)
		})
	}
	_, err = m.Acquire(ctx, "r")
	if !errors.Is(err, manager.ErrTooManyWaiters) || !errors.Is(err, manager.ErrNotAcquired) {
		t.Fatalf("third waiter: %v", err)
	}
	if got := series(t, reg, metrics.AcquireFailuresTotal, metrics.ClassDefault, metrics.ReasonTooManyWaiters); got != 1 {
		t.Fatalf("too_many_waiters failures = %v", got)
	}
	cancel()
	wg.Wait()
	_ = holder.Release(context.Background())
}

// Local waiters queue: only one of them polls Redis at a time.
func TestLocalWaitersQueue(t *testing.T) {
	_, c := miniClient(t)
	hook := &faultHook{}
	c.AddHook(hook)
	count := func() int64 {
		opts := []manager.Option{manager.WithCoalescing(false), manager.WithNotifications(false),
			manager.WithRetry(manager.LinearBackoff(10 * time.Millisecond))}
		m := newManager(t, c, opts...)
		res := testenv.Unique("q")
		holder, err := m.TryAcquire(ctxT(t), res)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		before := hook.seen.Load()
		var wg sync.WaitGroup
		for range 5 {
			wg.Go(func() { _, _ = m.Acquire(ctx, res) })
		}
		wg.Wait()
		_ = holder.Release(context.Background())
		return hook.seen.Load() - before
	}
	n := count()
	// Unqueued, 5 waiters polling every ~10-15 ms for 300 ms send ~100-150
	// commands; queued, one does: ~20-30.
	if n > 60 {
		t.Fatalf("5 local waiters sent %d commands in 300 ms: they do not queue", n)
	}
	t.Logf("5 local waiters sent %d commands in 300 ms", n)
}

// Close wakes the manager's waiters, queued in Redis or in the process:
// they return ErrClosed at once, not at their next re-check.
func TestCloseWakesWaiters(t *testing.T) {
	_, c := miniClient(t)
	holderM := newManager(t, c)
	ctx := ctxT(t)
	holder, err := holderM.TryAcquire(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	m, err := manager.New(ctx, c, manager.WithRetry(manager.LinearBackoff(time.Minute)), manager.WithStartupCheck(false))
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 3
	errc := make(chan error, waiters)
	for range waiters {
		go func() {
			_, err := m.Acquire(ctx, "r")
			errc <- err
		}()
	}
	eventually(t, 5*time.Second, "waiters queued", func() bool { return c.LLen(ctx, sharding.QueueKey(holder.Key())).Val() == 1 })
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(10 * time.Second) // the re-check is a minute away
	for range waiters {
		select {
		case err := <-errc:
			if !errors.Is(err, manager.ErrClosed) {
				t.Fatalf("waiter after Close: %v", err)
			}
		case <-timeout:
			t.Fatal("a waiter did not wake on Close")
		}
	}
	if n := c.LLen(ctx, sharding.QueueKey(holder.Key())).Val(); n != 0 {
		t.Fatalf("%d entries left queued", n)
	}
}
