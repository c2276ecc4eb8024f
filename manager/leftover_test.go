package manager_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

const (
	// leftoverTTL is the lock TTL of TestRealNothingOutlivesItsUse.
	leftoverTTL = time.Second
	// forcedRecordTTL is how long a forced release's record lives, as
	// ForceRelease documents.
	forcedRecordTTL = 5 * time.Minute
)

// Every kind of lock is taken and released (a waiter handed the lock
// through the queue, an election won and resigned, a forced release
// among them), every manager closed: then every key shardlock wrote has a
// TTL, and once the locks' TTL has passed only the fence counters (for
// scripts.FenceTTL past the lock's TTL) and the forced-release records
// (for their 5 minutes) are left.
func TestRealNothingOutlivesItsUse(t *testing.T) {
	for _, tg := range testenv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			c := tg.Client(t)
			prefix := testenv.Unique("left") + ":"
			opts := []manager.Option{manager.WithKeyPrefix(prefix), manager.WithTTL(leftoverTTL)}
			a := newManager(t, c, append(opts, manager.WithOwner("a"))...)
			b := newManager(t, c, append(opts, manager.WithOwner("b"))...)
			useEveryKind(t, c, a, b, 5)
			ctx := ctxT(t)
			for _, m := range []*manager.Manager{a, b} {
				if err := m.Close(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for k, ttl := range keysOf(t, c, prefix) {
				switch {
				case ttl <= 0:
					t.Errorf("%s has no TTL (%v)", k, ttl)
				case strings.HasSuffix(k, sharding.FenceSuffix):
					if ttl > scripts.FenceTTL+leftoverTTL {
						t.Errorf("%s lives %v, more than %v", k, ttl, scripts.FenceTTL+leftoverTTL)
					}
				case strings.HasSuffix(k, sharding.ForcedSuffix):
					if ttl > forcedRecordTTL {
						t.Errorf("%s lives %v, more than %v", k, ttl, forcedRecordTTL)
					}
				case ttl > 2*leftoverTTL:
					t.Errorf("%s lives %v, more than twice the TTL", k, ttl)
				}
			}
			eventually(t, 5*leftoverTTL, "every key but fence counters and forced records expires", func() bool {
				for k := range keysOf(t, c, prefix) {
					if !strings.HasSuffix(k, sharding.FenceSuffix) && !strings.HasSuffix(k, sharding.ForcedSuffix) {
						return false
					}
				}
				return true
			})
		})
	}
}

// useEveryKind takes and releases n locks of each kind with a and b.
func useEveryKind(t *testing.T, c redis.UniversalClient, a, b *manager.Manager, n int) {
	t.Helper()
	ctx := ctxT(t)
	must := func(l interface{ Release(context.Context) error }, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		r := testenv.Unique("r")
		must(a.TryAcquire(ctx, r+"plain"))
		must(a.TryAcquire(ctx, r+"fenced", manager.WithFencing(true)))
		x, _ := sharding.Group(r, "x")
		y, _ := sharding.Group(r, "y")
		must(a.TryAcquireBatch(ctx, []string{x, y}, manager.WithFencing(true)))
		must(a.TryAcquireMulti(ctx, []string{r + "m1", r + "m2"}))
		must(a.AcquireAny(ctx, r+"permits", 3))
		must(a.AcquireStripe(ctx, r+"stripes", 4, r))
		must(a.TryAcquireRead(ctx, r+"rw"))
		must(a.TryAcquireWrite(ctx, r+"rw", manager.WithFencing(true)))
		ld, err := a.Campaign(ctx, r+"election")
		if err != nil {
			t.Fatal(err)
		}
		if err := ld.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		queuedHandOver(t, c, a, b, r+"queued", i%2 == 0)
		if _, err := a.TryAcquire(ctx, r+"forced"); err != nil {
			t.Fatal(err)
		}
		if err := b.ForceRelease(ctx, r+"forced", "test"); err != nil {
			t.Fatal(err)
		}
	}
}

// queuedHandOver has b wait for a lock a holds, in the queue in Redis, and a
// hand it over by its release; b then releases it.
func queuedHandOver(t *testing.T, c redis.UniversalClient, a, b *manager.Manager, resource string, fenced bool) {
	t.Helper()
	ctx := ctxT(t)
	opts := []manager.AcquireOption{manager.WithFencing(fenced)}
	held, err := a.TryAcquire(ctx, resource, opts...)
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg   sync.WaitGroup
		got  *manager.Lock
		gerr error
	)
	wg.Go(func() { got, gerr = b.Acquire(ctx, resource, append(opts, manager.WithWait(10*time.Second))...) })
	eventually(t, 5*time.Second, "the waiter queued", func() bool {
		return c.Exists(ctx, sharding.QueueKey(held.Key())).Val() == 1
	})
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if gerr != nil {
		t.Fatal(gerr)
	}
	if fenced && got.Fence() <= held.Fence() {
		t.Fatalf("fence %d after %d", got.Fence(), held.Fence())
	}
	if err := got.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// keysOf returns every key with prefix on every master of c, with its TTL
// (redis.PTTL's: negative for none).
func keysOf(t *testing.T, c redis.UniversalClient, prefix string) map[string]time.Duration {
	t.Helper()
	ctx := ctxT(t)
	var (
		mu  sync.Mutex
		out = map[string]time.Duration{}
	)
	scan := func(ctx context.Context, node redis.Cmdable) error {
		iter := node.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			ttl, err := node.PTTL(ctx, k).Result()
			if err != nil {
				return err
			}
			if ttl == -2*time.Nanosecond {
				continue // expired meanwhile
			}
			mu.Lock()
			out[k] = ttl
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return scan(ctx, node) })
	} else {
		err = scan(ctx, c)
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A fence counter that expired between two holders gives way to the
// server's clock: the second holder's fence (and the second leader's term)
// is still above the first's. An extend renews a fenced lock's counter so
// that it outlives the lock.
func TestRealFenceCounterExpires(t *testing.T) {
	for _, tg := range testenv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			c := tg.Client(t)
			ctx := ctxT(t)
			m := newManager(t, c, manager.WithFencing(true), manager.WithWatchdog(false))
			expireCounter := func(key string) {
				t.Helper()
				fk := sharding.FenceKey(key)
				if ttl := c.PTTL(ctx, fk).Val(); ttl <= scripts.FenceTTL-time.Minute || ttl > scripts.FenceTTL+manager.DefaultTTL {
					t.Fatalf("fence counter TTL %v, want about %v", ttl, scripts.FenceTTL+manager.DefaultTTL)
				}
				c.PExpire(ctx, fk, time.Millisecond)
				eventually(t, 5*time.Second, "the counter expires", func() bool { return c.Exists(ctx, fk).Val() == 0 })
			}

			res := testenv.Unique("fence-expiry")
			first, err := m.TryAcquire(ctx, res)
			if err != nil {
				t.Fatal(err)
			}
			// The extend renews the counter, which is near its end.
			c.PExpire(ctx, sharding.FenceKey(first.Key()), time.Minute)
			if err := first.Extend(ctx, manager.DefaultTTL); err != nil {
				t.Fatal(err)
			}
			if err := first.Release(ctx); err != nil {
				t.Fatal(err)
			}
			expireCounter(first.Key())
			second, err := m.TryAcquire(ctx, res)
			if err != nil {
				t.Fatal(err)
			}
			if second.Fence() <= first.Fence() {
				t.Fatalf("fence %d after the counter expired, after %d", second.Fence(), first.Fence())
			}
			if err := second.Release(ctx); err != nil {
				t.Fatal(err)
			}

			name := testenv.Unique("term-expiry")
			ld, err := m.Campaign(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if err := ld.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			key, err := sharding.LockKey(sharding.DefaultPrefix, "election:"+name)
			if err != nil {
				t.Fatal(err)
			}
			expireCounter(key)
			next, err := m.Campaign(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			defer next.Resign(ctx)
			if next.Term() <= ld.Term() {
				t.Fatalf("term %d after the counter expired, after %d", next.Term(), ld.Term())
			}
		})
	}
}

// A lock whose key someone else made persistent (PERSIST) and that its
// holder then releases leaves nothing behind: no record of the release,
// with or without a TTL.
func TestRealReleaseOfAPersistedKeyLeavesNothing(t *testing.T) {
	for _, tg := range testenv.Targets() {
		t.Run(tg.Name, func(t *testing.T) {
			c := tg.Client(t)
			ctx := ctxT(t)
			m := newManager(t, c, manager.WithWatchdog(false))
			l, err := m.TryAcquire(ctx, testenv.Unique("persisted"))
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Persist(ctx, l.Key()).Err(); err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			nothingBeside(t, c, l.Key())
		})
	}
}
