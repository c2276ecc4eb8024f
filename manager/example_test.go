package manager_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

// exampleClient starts an embedded Redis (miniredis) for the examples; in a
// service this is your *redis.Client or *redis.ClusterClient.
func exampleClient() (*redis.Client, func()) {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	return c, func() { _ = c.Close(); mr.Close() }
}

func Example() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()

	m, err := manager.New(ctx, client, manager.WithOwner("billing-7"))
	if err != nil {
		panic(err)
	}
	defer m.Close(ctx)

	lock, err := m.Acquire(ctx, "order:123")
	if err != nil {
		panic(err)
	}
	fmt.Println("key:", lock.Key())
	// Work under lock.Context(): it is cancelled if the lock is lost.
	if err := lock.Release(ctx); err != nil {
		panic(err)
	}
	fmt.Println("released")
	// Output:
	// key: shardlock:{order:123}
	// released
}

func ExampleManager_TryAcquire() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	m, _ := manager.New(ctx, client)
	defer m.Close(ctx)

	first, _ := m.TryAcquire(ctx, "report:daily")
	_, err := m.TryAcquire(ctx, "report:daily")
	fmt.Println(errors.Is(err, manager.ErrNotAcquired))
	_ = first.Release(ctx)
	// Output: true
}

func ExampleManager_Acquire_retry() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	m, _ := manager.New(ctx, client)
	defer m.Close(ctx)

	holder, _ := m.TryAcquire(ctx, "job:import")
	// Wait at most 100 ms, retrying every ~10 ms.
	_, err := m.Acquire(ctx, "job:import",
		manager.WithWait(100*time.Millisecond),
		manager.WithRetry(manager.LinearBackoff(10*time.Millisecond)))
	fmt.Println(errors.Is(err, manager.ErrNotAcquired))
	_ = holder.Release(ctx)
	// Output: true
}

func ExampleManager_Do() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	m, _ := manager.New(ctx, client, manager.WithFencing(true))
	defer m.Close(ctx)

	err := m.Do(ctx, "account:42", func(ctx context.Context) error {
		// ctx is cancelled if the lock is lost; pass the fence to the
		// storage so it can reject writes from an older holder.
		fmt.Println("working")
		return nil
	})
	fmt.Println(err)
	// Output:
	// working
	// <nil>
}

func ExampleLock_Extend() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	m, _ := manager.New(ctx, client, manager.WithWatchdog(false))
	defer m.Close(ctx)

	lock, _ := m.TryAcquire(ctx, "cache:rebuild", manager.WithTTL(time.Second))
	if err := lock.Extend(ctx, time.Minute); err != nil {
		panic(err)
	}
	ttl, _ := lock.TTL(ctx)
	fmt.Println(ttl > 59*time.Second)
	_ = lock.Release(ctx)
	// Output: true
}

func ExampleLock_Fence() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	m, _ := manager.New(ctx, client)
	defer m.Close(ctx)

	// Each fence is above every one before it: pass it with every write
	// to the protected storage, which refuses a write whose fence is below
	// one it has seen.
	var last uint64
	for range 3 {
		lock, _ := m.TryAcquire(ctx, "ledger", manager.WithFencing(true))
		fmt.Println(lock.Fence() > last)
		last = lock.Fence()
		_ = lock.Release(ctx)
	}
	// Output:
	// true
	// true
	// true
}

// A batch lock takes several resources of one slot, all or none, in one
// script: build their names with sharding.Group.
func ExampleManager_AcquireBatch() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	m, _ := manager.New(ctx, client)
	defer m.Close(ctx)

	var items []string
	for _, part := range []string{"item:1", "item:2", "item:3"} {
		r, _ := sharding.Group("order:123", part)
		items = append(items, r)
	}
	lock, err := m.AcquireBatch(ctx, items)
	if err != nil {
		panic(err)
	}
	fmt.Println(lock.Keys())
	_ = lock.Release(ctx)
	// Output:
	// [shardlock:{order:123}:item:1 shardlock:{order:123}:item:2 shardlock:{order:123}:item:3]
}

// AcquireMulti takes resources anywhere in the cluster, one batch per slot,
// in one global order, so that callers with overlapping sets never
// deadlock.
func ExampleManager_AcquireMulti() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	m, _ := manager.New(ctx, client)
	defer m.Close(ctx)

	lock, err := m.AcquireMulti(ctx, []string{"account:alice", "account:bob"})
	if err != nil {
		panic(err)
	}
	// Move money between the two accounts under lock.Context().
	fmt.Println(len(lock.Locks()), "locks")
	_ = lock.Release(ctx)
	// Output:
	// 2 locks
}

// A hot resource striped 8 ways: work on partitions of different stripes
// runs in parallel, and the stripes spread over the cluster's masters.
func ExampleManager_AcquireStripe() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	m, _ := manager.New(ctx, client)
	defer m.Close(ctx)

	lock, err := m.AcquireStripe(ctx, "inventory", 8, "sku-4711")
	if err != nil {
		panic(err)
	}
	fmt.Println(lock.Resource())
	_ = lock.Release(ctx)
	// Output:
	// inventory#2
}

// AcquireAny is a semaphore: at most permits holders at a time.
func ExampleManager_AcquireAny() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	m, _ := manager.New(ctx, client)
	defer m.Close(ctx)

	var held []*manager.Lock
	for range 3 {
		l, err := m.AcquireAny(ctx, "export-slots", 3)
		if err != nil {
			panic(err)
		}
		held = append(held, l)
	}
	_, err := m.AcquireAny(ctx, "export-slots", 3, manager.WithWait(50*time.Millisecond))
	fmt.Println("a fourth:", errors.Is(err, manager.ErrNotAcquired))
	for _, l := range held {
		_ = l.Release(ctx)
	}
	// Output:
	// a fourth: true
}

// A job accepted by one process and finished by another takes its lock
// along: the first hands on the token and forgets the lock, the second
// resumes it.
func ExampleManager_Resume() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	accepter, _ := manager.New(ctx, client, manager.WithOwner("accepter"))
	defer accepter.Close(ctx)
	finisher, _ := manager.New(ctx, client, manager.WithOwner("finisher"))
	defer finisher.Close(ctx)

	lock, _ := accepter.Acquire(ctx, "job:42")
	token := lock.Token() // sent with the job; a secret, like the lock itself

	resumed, err := finisher.Resume(ctx, "job:42", token)
	if err != nil {
		panic(err)
	}
	_ = lock.Forget() // the accepter no longer renews or releases it
	fmt.Println(errors.Is(lock.Release(ctx), manager.ErrForgotten))
	fmt.Println(resumed.Release(ctx))
	// Output:
	// true
	// <nil>
}

// Leader election: Campaign blocks until this process leads; the term
// fences the leader's writes; Resign hands the lead to the next campaigner.
func ExampleManager_Campaign() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	m, _ := manager.New(ctx, client, manager.WithOwner("scheduler-1"))
	defer m.Close(ctx)

	lead, err := m.Campaign(ctx, "nightly-report")
	if err != nil {
		panic(err)
	}
	// Lead under lead.Context(): it is cancelled if the leadership is lost.
	info, _ := m.Leader(ctx, "nightly-report")
	fmt.Println(info.Owner, info.Term == lead.Term())
	_ = lead.Resign(ctx)
	_, err = m.Leader(ctx, "nightly-report")
	fmt.Println(errors.Is(err, manager.ErrNoLeader))
	// Output:
	// scheduler-1 true
	// true
}

// Inspect tells an operator who holds a lock and who waits for it, without
// the token's secret.
func ExampleManager_Inspect() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	m, _ := manager.New(ctx, client, manager.WithOwner("billing-7"))
	defer m.Close(ctx)

	lock, _ := m.TryAcquire(ctx, "order:123")
	info, _ := m.Inspect(ctx, "order:123")
	fmt.Println(info.Held, info.Owner, info.Waiters, info.TTL > 0)
	_ = lock.Release(ctx)
	// Output:
	// true billing-7 0 true
}

// An operator frees a stuck lock; its holder learns who and why.
func ExampleManager_ForceRelease() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	worker, _ := manager.New(ctx, client, manager.WithOwner("worker-1"))
	defer worker.Close(ctx)
	ops, _ := manager.New(ctx, client, manager.WithOwner("ops-alice"))
	defer ops.Close(ctx)

	lock, _ := worker.Acquire(ctx, "report:daily")
	if err := ops.ForceRelease(ctx, "report:daily", "stuck since the deploy"); err != nil {
		panic(err)
	}
	err := lock.Release(ctx)
	var forced *manager.ForcedReleaseError
	fmt.Println(errors.As(err, &forced), forced.By, forced.Reason)
	// Output:
	// true ops-alice stuck since the deploy
}

// A read-write lock: readers share it, a writer has it alone. A writer that
// waits makes new readers wait behind it.
func ExampleManager_AcquireRead() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	m, _ := manager.New(ctx, client, manager.WithOwner("catalog-1"), manager.WithFencing(true))
	defer m.Close(ctx)

	r1, _ := m.AcquireRead(ctx, "catalog")
	r2, err := m.AcquireRead(ctx, "catalog") // readers share it
	fmt.Println(err)
	_, err = m.TryAcquireWrite(ctx, "catalog")
	fmt.Println(errors.Is(err, manager.ErrNotAcquired))

	_ = r1.Release(ctx)
	_ = r2.Release(ctx)
	w, _ := m.AcquireWrite(ctx, "catalog") // alone now, with a fence
	fmt.Println(w.Fence() > 0)
	_ = w.Release(ctx)
	// Output:
	// <nil>
	// true
	// true
}
