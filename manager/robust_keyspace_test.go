package manager_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

// keyOf is the lock key of resource with the default prefix.
func keyOf(resource string) string {
	k, err := sharding.LockKey(sharding.DefaultPrefix, resource)
	if err != nil {
		panic(err)
	}
	return k
}

// dump returns a key's type and serialized value, to show it unchanged.
func dump(t *testing.T, c redis.UniversalClient, key string) string {
	t.Helper()
	ctx := context.Background()
	typ := c.Type(ctx, key).Val()
	v, err := c.Dump(ctx, key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return typ + ":" + v
}

// A fence counter that is not an integer, or would overflow, makes a
// fenced acquire fail with nothing left behind: no lock key, the counter
// as it was.
func TestRealFenceCounterJunkLeavesNothing(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := ctxT(t)
		m := newManager(t, c, manager.WithFencing(true))
		holder := newManager(t, c)
		counters := []struct {
			name string
			set  func(key string)
		}{
			{"not an integer", func(k string) { c.Set(ctx, k, "abc", time.Minute) }},
			{"max int64", func(k string) { c.Set(ctx, k, strconv.FormatInt(1<<63-1, 10), time.Minute) }},
			{"a hash", func(k string) { c.HSet(ctx, k, "f", "v"); c.Expire(ctx, k, time.Minute) }},
		}
		acquires := []struct {
			name string
			run  func(res string) (keys []string, err error)
		}{
			{"TryAcquire", func(res string) ([]string, error) {
				_, err := m.TryAcquire(ctx, res)
				return []string{keyOf(res)}, err
			}},
			{"Acquire", func(res string) ([]string, error) {
				_, err := m.Acquire(ctx, res, manager.WithWait(time.Second))
				return []string{keyOf(res)}, err
			}},
			{"Acquire handed over by a release", func(res string) ([]string, error) {
				h, err := holder.TryAcquire(ctx, res)
				if err != nil {
					return nil, err
				}
				done := make(chan error, 1)
				go func() {
					_, err := m.Acquire(ctx, res, manager.WithWait(5*time.Second))
					done <- err
				}()
				eventually(t, 5*time.Second, "waiter queued", func() bool {
					return c.LLen(ctx, sharding.QueueKey(keyOf(res))).Val() == 1
				})
				if err := h.Release(ctx); err != nil {
					return nil, err
				}
				return []string{keyOf(res)}, <-done
			}},
			{"TryAcquireBatch", func(res string) ([]string, error) {
				a, b := "{"+res+"}:a", "{"+res+"}:b"
				_, err := m.TryAcquireBatch(ctx, []string{a, b})
				return []string{keyOf(a), keyOf(b)}, err
			}},
		}
		for _, cn := range counters {
			for _, acq := range acquires {
				t.Run(cn.name+"/"+acq.name, func(t *testing.T) {
					res := testenv.Unique("fence")
					var fenceKeys []string
					if acq.name == "TryAcquireBatch" {
						// The second key's counter is the bad one: the first
						// key's is incremented, then the script fails.
						fenceKeys = []string{sharding.FenceKey(keyOf("{" + res + "}:b"))}
					} else {
						fenceKeys = []string{sharding.FenceKey(keyOf(res))}
					}
					for _, k := range fenceKeys {
						cn.set(k)
					}
					before := dump(t, c, fenceKeys[0])
					keys, err := acq.run(res)
					if err == nil {
						t.Fatal("the acquire succeeded")
					}
					if errors.Is(err, manager.ErrNotAcquired) && !errors.Is(err, context.DeadlineExceeded) {
						t.Logf("err %v", err)
					}
					for _, k := range keys {
						if c.Exists(ctx, k).Val() != 0 {
							t.Fatalf("the lock key %s was left behind (err %v)", k, err)
						}
					}
					if after := dump(t, c, fenceKeys[0]); after != before {
						t.Fatalf("the counter changed: %q -> %q", before, after)
					}
				})
			}
		}
	})
}

// A lock key that holds something shardlock did not write (another value,
// another type) is held by someone else: acquires report it as such, and
// leave it byte for byte as it was, even while they wait.
func TestRealForeignKeyIsHeldAndLeftAlone(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := ctxT(t)
		m := newManager(t, c)
		foreign := []struct {
			name string
			set  func(key string)
		}{
			{"a string", func(k string) { c.Set(ctx, k, "foobar", time.Minute) }},
			{"a hash", func(k string) { c.HSet(ctx, k, "f", "v"); c.Expire(ctx, k, time.Minute) }},
			{"a list", func(k string) { c.RPush(ctx, k, "a"); c.Expire(ctx, k, time.Minute) }},
		}
		calls := []struct {
			name string
			run  func(res string) error
		}{
			{"TryAcquire", func(res string) error { _, err := m.TryAcquire(ctx, res); return err }},
			{"TryAcquire fenced", func(res string) error {
				_, err := m.TryAcquire(ctx, res, manager.WithFencing(true))
				return err
			}},
			{"Acquire", func(res string) error {
				_, err := m.Acquire(ctx, res, manager.WithWait(300*time.Millisecond))
				return err
			}},
			{"TryAcquireBatch", func(res string) error {
				_, err := m.TryAcquireBatch(ctx, []string{"{" + res + "}:free", "{" + res + "}"})
				return err
			}},
			{"AcquireBatch", func(res string) error {
				_, err := m.AcquireBatch(ctx, []string{"{" + res + "}:free", "{" + res + "}"},
					manager.WithWait(300*time.Millisecond))
				return err
			}},
		}
		for _, f := range foreign {
			for _, call := range calls {
				t.Run(f.name+"/"+call.name, func(t *testing.T) {
					res := testenv.Unique("foreign")
					key := keyOf(res)
					f.set(key)
					before := dump(t, c, key)
					err := call.run(res)
					if !errors.Is(err, manager.ErrNotAcquired) {
						t.Fatalf("got %v, want ErrNotAcquired", err)
					}
					if after := dump(t, c, key); after != before {
						t.Fatalf("the key changed: %q -> %q", before, after)
					}
					if free := keyOf("{" + res + "}:free"); c.Exists(ctx, free).Val() != 0 {
						t.Fatal("a batch left its free key behind")
					}
				})
			}
		}
	})
}

// A held lock whose key is retyped behind its back is lost as "not held":
// Extend, TTL and Release say so (not a raw WRONGTYPE), the watchdog stops
// at once, and the key is left as it is.
func TestRealRetypedLockIsNotHeld(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := ctxT(t)
		m := newManager(t, c, manager.WithTTL(time.Second))
		retype := func(t *testing.T, keys []string) {
			for _, k := range keys {
				c.Del(ctx, k)
				c.HSet(ctx, k, "f", "v")
				c.Expire(ctx, k, time.Minute)
			}
		}
		calls := []struct {
			name string
			run  func(l *manager.Lock) error
		}{
			{"Extend", func(l *manager.Lock) error { return l.Extend(ctx, time.Second) }},
			{"TTL", func(l *manager.Lock) error { _, err := l.TTL(ctx); return err }},
			{"Release", func(l *manager.Lock) error { return l.Release(ctx) }},
			{"watchdog", func(l *manager.Lock) error { <-l.Done(); return l.Err() }},
		}
		for _, batch := range []bool{false, true} {
			for _, call := range calls {
				name := call.name
				if batch {
					name = "batch " + name
				}
				t.Run(name, func(t *testing.T) {
					res := testenv.Unique("retype")
					var (
						l   *manager.Lock
						err error
					)
					if batch {
						l, err = m.TryAcquireBatch(ctx, []string{"{" + res + "}:a", "{" + res + "}:b"})
					} else {
						l, err = m.TryAcquire(ctx, res)
					}
					if err != nil {
						t.Fatal(err)
					}
					retype(t, l.Keys()[len(l.Keys())-1:])
					before := dump(t, c, l.Keys()[len(l.Keys())-1])
					err = call.run(l)
					if !errors.Is(err, manager.ErrLockLost) && !errors.Is(err, manager.ErrNotHeld) && !errors.Is(err, manager.ErrExpired) {
						t.Fatalf("got %v, want the not-held family", err)
					}
					if !batch && !errors.Is(err, manager.ErrNotHeld) {
						t.Fatalf("got %v, want ErrNotHeld", err)
					}
					waitDone(t, l, 5*time.Second)
					if !errors.Is(l.Err(), manager.ErrLockLost) {
						t.Fatalf("Err = %v, want ErrLockLost", l.Err())
					}
					if after := dump(t, c, l.Keys()[len(l.Keys())-1]); after != before {
						t.Fatalf("the key changed: %q -> %q", before, after)
					}
				})
			}
		}
	})
}

// A tampered waiter queue neither fails a waiter nor strands a lock: a
// queue key of another type leaves the waiter polling, and junk entries are
// skipped by the release, which still frees the key.
func TestRealTamperedQueue(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := ctxT(t)
		m := newManager(t, c)
		other := newManager(t, c)
		t.Run("queue of another type", func(t *testing.T) {
			res := testenv.Unique("queue")
			q := sharding.QueueKey(keyOf(res))
			c.Set(ctx, q, "not a list", time.Minute)
			h, err := other.TryAcquire(ctx, res)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() {
				l, err := m.Acquire(ctx, res, manager.WithWait(5*time.Second))
				if err == nil {
					err = l.Release(ctx)
				}
				got <- err
			}()
			eventually(t, 5*time.Second, "the waiter has tried", func() bool {
				// It polls: the holder's key is left unmarked.
				return c.Get(ctx, h.Key()).Val() == h.Token()
			})
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatalf("the waiter got %v", err)
			}
			if v := c.Get(ctx, q).Val(); v != "not a list" {
				t.Fatalf("the queue key changed to %q", v)
			}
		})
		junk := []string{
			"99999999999999:1000:0:",
			"99999999999999:abc:0:sl1.1.AAAAAAAAAAAAAAAAAAAAAA.o",
			"99999999999999:0:0:sl1.1.AAAAAAAAAAAAAAAAAAAAAA.o",
			"99999999999999:1000:7:sl1.1.AAAAAAAAAAAAAAAAAAAAAA.o",
			"99999999999999:1000:0:not-a-token",
			"junk",
		}
		for _, e := range junk {
			t.Run("junk entry "+e, func(t *testing.T) {
				res := testenv.Unique("junk")
				l, err := m.TryAcquire(ctx, res)
				if err != nil {
					t.Fatal(err)
				}
				// As a waiter would have left it: the key marked, the entry queued.
				c.Set(ctx, l.Key(), l.Token()+"\x1e", redis.KeepTTL)
				c.RPush(ctx, sharding.QueueKey(l.Key()), e)
				if err := l.Release(ctx); err != nil {
					t.Fatalf("Release = %v", err)
				}
				if c.Exists(ctx, l.Key()).Val() != 0 {
					t.Fatalf("the key holds %q after the release", c.Get(ctx, l.Key()).Val())
				}
			})
		}
	})
}
