package manager_test

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

// slowRecheck makes queued waiters re-check only every 5 s, so that a test
// sees whether they were handed the lock (at once) or found it themselves.
var slowRecheck = manager.WithRetry(manager.LinearBackoff(5 * time.Second))

// queueLen returns how many waiters are queued in Redis for key.
func queueLen(t *testing.T, c redis.UniversalClient, key string) int64 {
	t.Helper()
	n, err := c.LLen(context.Background(), sharding.QueueKey(key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

type acquired struct {
	who  int
	l    *manager.Lock
	err  error
	when time.Time
}

// A hand-over is announced to the new holder's Manager and to the Managers
// of the two waiters queued next (which look again when the claim lease
// ends, should the new holder have died), each on its own hand-over
// channel, and to nobody else: a release sends at most three messages
// however many processes wait. (The native hand-over, on Valkey 9 and Redis 8, tells the
// new holder's Manager only: handover_native.go.) The lock's own channel carries only "free",
// when the last holder's release deletes the marked key with nobody left to
// hand it.
func TestRealHandOverReachesItsWaitersOnly(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := ctxT(t)
		res := testenv.Unique("fanout")
		ms, listen := fanout(t, ctx, c, 5)
		holder, err := ms[0].TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		heard := listen(holder.Key())
		got := make(chan acquired, 4)
		for i := 1; i <= 4; i++ {
			go func() {
				l, err := ms[i].Acquire(ctx, res)
				got <- acquired{who: i, l: l, err: err}
			}()
			eventually(t, 5*time.Second, fmt.Sprintf("waiter %d queued", i), func() bool { return queueLen(t, c, holder.Key()) == int64(i) })
		}
		var want []string
		prev := holder
		for i := 1; i <= 4; i++ {
			if err := prev.Release(ctx); err != nil {
				t.Fatal(err)
			}
			a := <-got
			if a.err != nil || a.who != i {
				t.Fatalf("waiter %d got the lock (%v); want waiter %d", a.who, a.err, i)
			}
			// To the new holder and to the two queued next, if any; on
			// Valkey 9 and Redis 8, a lock that was itself handed over
			// hands on in the conditional commands, which tell the new
			// holder only.
			last := min(i+2, 4)
			if onConditional() && i > 1 {
				last = i
			}
			for w := i; w <= last; w++ {
				want = append(want, fmt.Sprintf("%d: %s 0", w, digestOf(a.l)))
			}
			prev = a.l
		}
		if err := prev.Release(ctx); err != nil {
			t.Fatal(err)
		}
		heard(append(want, "lock: free"))
	})
}

// The same for a read-write lock: a release that hands it to a run of
// readers announces each to its own Manager, and the last of them also to
// the writer queued behind them (the one entry left).
func TestRealReadersHandOverReachesItsWaitersOnly(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := ctxT(t)
		res := testenv.Unique("fanout-rw")
		ms, listen := fanout(t, ctx, c, 4)
		writer, err := ms[0].TryAcquireWrite(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		heard := listen(writer.Key())
		got := make([]chan *manager.Lock, 4)
		for i := 1; i <= 3; i++ {
			got[i] = make(chan *manager.Lock, 1)
			go func() {
				acquire := ms[i].AcquireRead
				if i == 3 {
					acquire = ms[i].AcquireWrite
				}
				l, err := acquire(ctx, res)
				if err != nil {
					t.Error(err)
				}
				got[i] <- l
			}()
			eventually(t, 5*time.Second, fmt.Sprintf("waiter %d queued", i), func() bool {
				info, err := ms[0].Inspect(ctx, res)
				return err == nil && info.Waiters == i
			})
		}
		if err := writer.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r1, r2 := <-got[1], <-got[2]
		if r1 == nil || r2 == nil {
			t.FailNow()
		}
		if err := r1.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := r2.Release(ctx); err != nil {
			t.Fatal(err)
		}
		w := <-got[3]
		if w == nil {
			t.FailNow()
		}
		heard([]string{
			"1: " + digestOf(r1) + " 0",
			"2: " + digestOf(r2) + " 0", "3: " + digestOf(r2) + " 0",
			"3: " + digestOf(w) + " 0",
		})
		if err := w.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// fanout makes n managers on c, owners "fanout-0" to "fanout-<n-1>",
// their queued waiters re-checking only every 5 s; listen
// subscribes the channels of the lock at key, its own and each manager's
// hand-over channel, and returns heard, which asserts that the messages
// on them are want, in order (each "<manager or lock>: <payload>"), and
// nothing else before them.
func fanout(t *testing.T, ctx context.Context, c redis.UniversalClient, n int) (ms []*manager.Manager, listen func(key string) (heard func(want []string))) {
	for i := range n {
		ms = append(ms, newManager(t, c, slowRecheck, manager.WithOwner(fmt.Sprintf("fanout-%d", i))))
	}
	return ms, func(key string) func([]string) {
		names := map[string]string{sharding.ChannelName(key): "lock"}
		chans := []string{sharding.ChannelName(key)}
		for i := range n {
			ch := sharding.HandoverChannel(key, fmt.Sprintf("fanout-%d", i))
			names[ch] = fmt.Sprint(i)
			chans = append(chans, ch)
		}
		var ps *redis.PubSub
		switch cl := c.(type) {
		case *redis.ClusterClient:
			ps = cl.SSubscribe(ctx, chans...)
		case *redis.Client:
			ps = cl.SSubscribe(ctx, chans...)
		default:
			t.Fatalf("client %T", c)
		}
		t.Cleanup(func() { _ = ps.Close() })
		for range chans {
			if _, err := ps.Receive(ctx); err != nil { // the confirmations
				t.Fatal(err)
			}
		}
		return func(want []string) {
			t.Helper()
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			var heard []string
			for len(heard) < len(want) {
				msg, err := ps.ReceiveMessage(rctx)
				if err != nil {
					t.Fatalf("heard %q, then: %v", heard, err)
				}
				heard = append(heard, names[msg.Channel]+": "+msg.Payload)
			}
			if !slices.Equal(heard, want) {
				t.Fatalf("announcements heard:\n%s\nwant:\n%s", strings.Join(heard, "\n"), strings.Join(want, "\n"))
			}
		}
	}
}

// digestOf is the sha1 of l's token in hex, as a hand-over announces it.
func digestOf(l *manager.Lock) string {
	return fmt.Sprintf("%x", sha1.Sum([]byte(l.Token())))
}

// Waiters of different managers get the lock in the order they queued, each
// handed it by the release before (not by a re-check), and nothing is left
// behind in Redis.
func TestRealFairQueueOrder(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := ctxT(t)
		res := testenv.Unique("fair")
		var ms []*manager.Manager
		for i := range 4 {
			ms = append(ms, newManager(t, c, slowRecheck, manager.WithOwner(fmt.Sprintf("fair-%d", i)), manager.WithFencing(true)))
		}
		holder, err := ms[0].TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		key := holder.Key()
		got := make(chan acquired, 3)
		for i := 1; i <= 3; i++ {
			go func() {
				l, err := ms[i].Acquire(ctx, res)
				got <- acquired{who: i, l: l, err: err, when: time.Now()}
			}()
			// Queue them one after the other.
			eventually(t, 5*time.Second, fmt.Sprintf("waiter %d queued", i), func() bool { return queueLen(t, c, key) == int64(i) })
		}
		// The queue expires with its last entry (the waiters' wait limit).
		if ttl := c.PTTL(ctx, sharding.QueueKey(key)).Val(); ttl <= 0 || ttl > 31*time.Second {
			t.Fatalf("queue TTL %v", ttl)
		}
		// A queued waiter marks the key; its holder still owns it.
		if v := c.Get(ctx, key).Val(); v != holder.Token()+sharding.QueuedMark {
			t.Fatalf("key holds %q with waiters queued", v)
		}
		if ttl, err := holder.TTL(ctx); err != nil || ttl <= 0 {
			t.Fatalf("TTL of a marked key: %v, %v", ttl, err)
		}
		if _, err := manager.ParseToken(c.Get(ctx, key).Val()); err != nil {
			t.Fatalf("ParseToken of a marked value: %v", err)
		}
		prev := holder
		for i := 1; i <= 3; i++ {
			released := time.Now()
			if err := prev.Release(ctx); err != nil {
				t.Fatal(err)
			}
			a := <-got
			if a.err != nil {
				t.Fatal(a.err)
			}
			if a.who != i {
				t.Fatalf("waiter %d got the lock before waiter %d", a.who, i)
			}
			if a.l.Fence() <= prev.Fence() {
				t.Fatalf("fence %d after %d", a.l.Fence(), prev.Fence())
			}
			// The re-check is 5 s away: well under it means a hand-over.
			if waited := a.when.Sub(released); waited > 2*time.Second {
				t.Fatalf("waiter %d took %v after the release: it re-checked instead of being handed the lock", i, waited)
			}
			if err := a.l.Extend(ctx, 10*time.Second); err != nil {
				t.Fatalf("handed-over lock: extend: %v", err)
			}
			prev = a.l
		}
		if err := prev.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if n := c.Exists(ctx, key, sharding.QueueKey(key)).Val(); n != 0 {
			t.Fatalf("%d of the lock key and its queue left behind", n)
		}
	})
}

// A queued waiter that gives up leaves the queue; a release after that
// deletes the key instead of handing it to nobody.
func TestRealFairQueueGiveUp(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m := newManager(t, c, slowRecheck)
		res := testenv.Unique("giveup")
		holder, err := m.TryAcquire(ctxT(t), res)
		if err != nil {
			t.Fatal(err)
		}
		waiter := newManager(t, c, slowRecheck)
		ctx, cancel := context.WithCancel(ctxT(t))
		errc := make(chan error, 1)
		go func() {
			_, err := waiter.Acquire(ctx, res)
			errc <- err
		}()
		eventually(t, 5*time.Second, "waiter queued", func() bool { return queueLen(t, c, holder.Key()) == 1 })
		cancel()
		if err := <-errc; !errors.Is(err, manager.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled waiter: %v", err)
		}
		// The waiter's context has ended: it leaves Redis's queue in the
		// background, as it returns.
		eventually(t, 2*time.Second, "the waiter's entry leaves the queue", func() bool { return queueLen(t, c, holder.Key()) == 0 })
		if err := holder.Release(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if n := c.Exists(ctxT(t), holder.Key()).Val(); n != 0 {
			t.Fatal("released key still there")
		}
	})
}

// An entry past its deadline (a waiter that died without leaving) is
// dropped, not handed the lock.
func TestRealFairQueueSkipsDeadEntries(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := ctxT(t)
		m := newManager(t, c)
		holder, err := m.TryAcquire(ctx, testenv.Unique("dead"))
		if err != nil {
			t.Fatal(err)
		}
		q := sharding.QueueKey(holder.Key())
		past := time.Now().Add(-time.Second).UnixMilli()
		if err := c.RPush(ctx, q, fmt.Sprintf("%d:10000:0:sl1.dead-1", past), fmt.Sprintf("%d:10000:0:sl1.dead-2", past)).Err(); err != nil {
			t.Fatal(err)
		}
		// As a waiter that queues marks the key.
		if err := c.SetArgs(ctx, holder.Key(), holder.Token()+sharding.QueuedMark, redis.SetArgs{KeepTTL: true}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if n := c.Exists(ctx, holder.Key(), q).Val(); n != 0 {
			t.Fatalf("key %q = %q, queue length %d: a dead waiter got the lock", holder.Key(), c.Get(ctx, holder.Key()).Val(), c.LLen(ctx, q).Val())
		}
	})
}

// Announcements are at most once: a waiter whose hand-over went unannounced
// finds its own token in the key when it re-checks, and holds the lock.
func TestRealFairQueueMissedAnnouncement(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := ctxT(t)
		m := newManager(t, c, manager.WithRetry(manager.LinearBackoff(50*time.Millisecond)))
		res := testenv.Unique("missed")
		key, err := sharding.LockKey(sharding.DefaultPrefix, res)
		if err != nil {
			t.Fatal(err)
		}
		// Held by someone outside shardlock, so no release script runs.
		if err := c.Set(ctx, key, "someone-else", 10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
		got := make(chan acquired, 1)
		go func() {
			l, err := m.Acquire(ctx, res)
			got <- acquired{l: l, err: err}
		}()
		eventually(t, 5*time.Second, "waiter queued", func() bool { return queueLen(t, c, key) == 1 })
		// Hand the key over by hand, announcing nothing.
		entry, err := c.LPop(ctx, sharding.QueueKey(key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		parts := strings.SplitN(entry, ":", 4)
		if len(parts) != 4 {
			t.Fatalf("entry %q", entry)
		}
		if err := c.Set(ctx, key, parts[3], 10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
		a := <-got
		if a.err != nil {
			t.Fatal(a.err)
		}
		if a.l.Token() != parts[3] {
			t.Fatal("the waiter holds a token other than its queued one")
		}
		if err := a.l.Release(ctx); err != nil {
			t.Fatalf("release: %v", err)
		}
	})
}

// Waiters of one manager take the lock in turn, handed it by each other's
// release, with fences rising.
func TestRealFairQueueLocalHandoff(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := ctxT(t)
		m := newManager(t, c, slowRecheck, manager.WithFencing(true))
		res := testenv.Unique("local")
		holder, err := m.TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		const waiters = 6
		got := make(chan acquired, waiters)
		var (
			mu    sync.Mutex
			order []uint64
		)
		for range waiters {
			go func() {
				l, err := m.Acquire(ctx, res)
				if err == nil {
					mu.Lock()
					order = append(order, l.Fence()) // in acquisition order: we hold the lock
					mu.Unlock()
					time.Sleep(time.Millisecond) // hold it a moment, as a caller would
					err = l.Release(ctx)
				}
				got <- acquired{l: l, err: err}
			}()
		}
		eventually(t, 5*time.Second, "first waiter queued", func() bool { return queueLen(t, c, holder.Key()) == 1 })
		start := time.Now()
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		for range waiters {
			if a := <-got; a.err != nil {
				t.Fatal(a.err)
			}
		}
		last := holder.Fence()
		for _, f := range order {
			if f <= last {
				t.Fatalf("fences in acquisition order %v after %d", order, holder.Fence())
			}
			last = f
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("%d local waiters took %v: they re-checked instead of being handed the lock", waiters, d)
		}
		if n := c.Exists(ctx, holder.Key(), sharding.QueueKey(holder.Key())).Val(); n != 0 {
			t.Fatalf("%d of the lock key and its queue left behind", n)
		}
	})
}

// A waiter handed the lock after its manager closed gives it up: the key
// does not stay held until its TTL.
func TestRealFairQueueHandoverAfterClose(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := ctxT(t)
		holderM := newManager(t, c)
		res := testenv.Unique("closed")
		holder, err := holderM.TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		w, err := manager.New(ctx, c, manager.WithRetry(manager.LinearBackoff(200*time.Millisecond)), manager.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := w.Acquire(ctx, res)
			errc <- err
		}()
		eventually(t, 5*time.Second, "waiter queued", func() bool { return queueLen(t, c, holder.Key()) == 1 })
		if err := w.Close(ctx); err != nil {
			t.Fatal(err)
		}
		// The release hands the key to the closed manager's waiter.
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; !errors.Is(err, manager.ErrClosed) {
			t.Fatalf("waiter of a closed manager: %v", err)
		}
		if n := c.Exists(ctx, holder.Key()).Val(); n != 0 {
			t.Fatalf("key %q still held (TTL %v) after its waiter's manager closed", holder.Key(), c.PTTL(ctx, holder.Key()).Val())
		}
	})
}

// A batch release hands each key with a queued waiter to that waiter.
func TestRealFairQueueBatchRelease(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := ctxT(t)
		m := newManager(t, c, manager.WithFencing(true))
		res := group(t, testenv.Unique("bq"), "a", "b")
		batch, err := m.TryAcquireBatch(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		waiter := newManager(t, c, slowRecheck, manager.WithFencing(true))
		got := make(chan acquired, 1)
		go func() {
			l, err := waiter.Acquire(ctx, res[0])
			got <- acquired{l: l, err: err, when: time.Now()}
		}()
		keys := batch.Keys()
		eventually(t, 5*time.Second, "waiter queued", func() bool { return queueLen(t, c, keys[0]) == 1 })
		released := time.Now()
		if err := batch.Release(ctx); err != nil {
			t.Fatal(err)
		}
		a := <-got
		if a.err != nil {
			t.Fatal(a.err)
		}
		if waited := a.when.Sub(released); waited > 2*time.Second {
			t.Fatalf("waiter took %v after the batch release: it re-checked instead of being handed the lock", waited)
		}
		if a.l.Fence() <= batch.Fences()[0] {
			t.Fatalf("fence %d after the batch's %d", a.l.Fence(), batch.Fences()[0])
		}
		if n := c.Exists(ctx, keys[1]).Val(); n != 0 {
			t.Fatal("the batch's other key, with nobody queued, is still there")
		}
		if err := a.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
