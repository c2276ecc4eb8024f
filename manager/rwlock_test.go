package manager_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

// Readers share a read-write lock; a writer excludes readers and other
// writers; each release says what it released; writers take rising fences,
// readers none.
func TestRealRWBasics(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m := newManager(t, c, manager.WithFencing(true))
		ctx := ctxT(t)
		res := testenv.Unique("rw")

		r1, err := m.TryAcquireRead(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := m.TryAcquireRead(ctx, res)
		if err != nil {
			t.Fatalf("second reader: %v", err)
		}
		if r1.Fence() != 0 || r2.Fence() != 0 {
			t.Fatalf("readers' fences %d, %d; want 0", r1.Fence(), r2.Fence())
		}
		if _, err := m.TryAcquireWrite(ctx, res); !errors.Is(err, manager.ErrNotAcquired) {
			t.Fatalf("writer while read = %v", err)
		}
		if _, err := m.TryAcquire(ctx, res); !errors.Is(err, manager.ErrNotAcquired) {
			t.Fatalf("exclusive lock on a read-write lock's key = %v", err)
		}
		if d, err := r1.TTL(ctx); err != nil || d <= 0 || d > manager.DefaultTTL {
			t.Fatalf("reader TTL = %v, %v", d, err)
		}
		if err := r1.Extend(ctx, time.Minute); err != nil {
			t.Fatalf("reader Extend: %v", err)
		}
		if pttl := c.PTTL(ctx, r1.Key()).Val(); pttl <= manager.DefaultTTL {
			t.Fatalf("key PTTL %v after a reader's extension to 1m", pttl)
		}
		if err := r1.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if d, err := r2.TTL(ctx); err != nil || d <= 0 || d > manager.DefaultTTL {
			t.Fatalf("the other reader's TTL = %v, %v", d, err)
		}
		if _, err := m.TryAcquireWrite(ctx, res); !errors.Is(err, manager.ErrNotAcquired) {
			t.Fatalf("writer with one reader left = %v", err)
		}
		if err := r2.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if c.Exists(ctx, r2.Key()).Val() != 0 {
			t.Fatal("the lock's key left after its last reader's release")
		}

		w1, err := m.TryAcquireWrite(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		if w1.Fence() == 0 {
			t.Fatal("writer has no fence with fencing on")
		}
		if _, err := m.TryAcquireRead(ctx, res); !errors.Is(err, manager.ErrNotAcquired) {
			t.Fatalf("reader while written = %v", err)
		}
		if _, err := m.TryAcquireWrite(ctx, res); !errors.Is(err, manager.ErrNotAcquired) {
			t.Fatalf("second writer = %v", err)
		}
		if err := w1.Extend(ctx, 5*time.Second); err != nil {
			t.Fatalf("writer Extend: %v", err)
		}
		if err := w1.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := w1.Release(ctx); err != nil {
			t.Fatalf("second Release = %v, want the first's result", err)
		}
		if err := w1.Extend(ctx, time.Second); !errors.Is(err, manager.ErrReleased) {
			t.Fatalf("Extend after Release = %v", err)
		}
		w2, err := m.TryAcquireWrite(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		if w2.Fence() <= w1.Fence() {
			t.Fatalf("fence %d after %d", w2.Fence(), w1.Fence())
		}
		// A writer's key deleted under it: gone.
		c.Del(ctx, w2.Key())
		if err := w2.Release(ctx); !errors.Is(err, manager.ErrExpired) {
			t.Fatalf("Release of a gone writer = %v", err)
		}
		// A reader's share gone while another reader holds: expired, and
		// the other reader keeps its share.
		r3, _ := m.TryAcquireRead(ctx, res)
		r4, err := m.TryAcquireRead(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		c.HDel(ctx, r3.Key(), "r:"+r3.Token())
		if err := r3.Extend(ctx, time.Second); !errors.Is(err, manager.ErrExpired) {
			t.Fatalf("Extend of a gone share = %v", err)
		}
		if err := r4.Extend(ctx, time.Second); err != nil {
			t.Fatalf("the other reader's Extend = %v", err)
		}
		if err := r4.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// A key that is not a read-write lock of shardlock's (a string, another
// hash) is held by someone else: never written, never released.
func TestRealRWForeignKeys(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m := newManager(t, c)
		ctx := ctxT(t)
		for _, setup := range []struct {
			name string
			put  func(key string)
			same func(key string) bool
		}{
			{"exclusive lock", func(k string) { c.Set(ctx, k, "sl1.1.x.y", time.Minute) }, func(k string) bool { return c.Get(ctx, k).Val() == "sl1.1.x.y" }},
			{"other hash", func(k string) { c.HSet(ctx, k, "a", "b") }, func(k string) bool { return c.HGet(ctx, k, "a").Val() == "b" && c.HLen(ctx, k).Val() == 1 }},
			{"list", func(k string) { c.RPush(ctx, k, "x") }, func(k string) bool { return c.LLen(ctx, k).Val() == 1 }},
		} {
			t.Run(setup.name, func(t *testing.T) {
				res := testenv.Unique("rwforeign")
				key, _ := sharding.LockKey(sharding.DefaultPrefix, res)
				setup.put(key)
				defer c.Del(ctx, key)
				if _, err := m.TryAcquireRead(ctx, res); !errors.Is(err, manager.ErrNotAcquired) {
					t.Fatalf("reader = %v", err)
				}
				if _, err := m.TryAcquireWrite(ctx, res); !errors.Is(err, manager.ErrNotAcquired) {
					t.Fatalf("writer = %v", err)
				}
				wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				_, err := m.AcquireWrite(wctx, res)
				cancel()
				if !errors.Is(err, manager.ErrNotAcquired) {
					t.Fatalf("waiting writer = %v", err)
				}
				if !setup.same(key) {
					t.Fatal("the key was written")
				}
			})
		}
	})
}

// A waiting writer is handed the lock by the last reader's release, and
// the readers that queued behind it by the writer's release, all at once.
func TestRealRWHandOver(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m1 := newManager(t, c, manager.WithOwner("rw-a"))
		m2 := newManager(t, c, manager.WithOwner("rw-b"))
		ctx := ctxT(t)
		res := testenv.Unique("rwhand")

		r, err := m1.AcquireRead(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		wGot := make(chan *manager.Lock, 1)
		go func() {
			l, err := m2.AcquireWrite(ctx, res)
			if err != nil {
				t.Error(err)
			}
			wGot <- l
		}()
		key, _ := sharding.LockKey(sharding.DefaultPrefix, res)
		eventually(t, 5*time.Second, "the writer queues", func() bool { return c.HExists(ctx, key, "wq").Val() })
		queued := func() int { return len(strings.Split(c.HGet(ctx, key, "q").Val(), "\n")) }
		// New readers now wait behind the writer, in both processes.
		if _, err := m1.TryAcquireRead(ctx, res); !errors.Is(err, manager.ErrNotAcquired) {
			t.Fatalf("new reader with a writer waiting = %v", err)
		}
		var wg sync.WaitGroup
		readers := make(chan *manager.Lock, 4)
		for i := range 4 {
			mm := m1
			if i%2 == 1 {
				mm = m2
			}
			wg.Go(func() {
				l, err := mm.AcquireRead(ctx, res)
				if err != nil {
					t.Error(err)
					return
				}
				readers <- l
			})
		}
		// In Redis's queue: the writer and m1's first reader (the others
		// queue in their process, behind it and behind m2's writer).
		eventually(t, 5*time.Second, "the readers queue", func() bool { return queued() >= 2 })
		select {
		case <-readers:
			t.Fatal("a reader joined while the writer waited")
		default:
		}
		if err := r.Release(ctx); err != nil {
			t.Fatal(err)
		}
		w := <-wGot
		if w == nil {
			t.FailNow()
		}
		select {
		case <-readers:
			t.Fatal("a reader joined while the writer held the lock")
		default:
		}
		if err := w.Release(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(readers)
		n := 0
		for l := range readers {
			n++
			if err := l.Release(ctx); err != nil {
				t.Error(err)
			}
		}
		if n != 4 {
			t.Fatalf("%d readers got the lock, want 4", n)
		}
	})
}

// A reader whose process died frees its share when its TTL runs out, not
// before, though another reader came and went meanwhile: a waiting writer
// takes the lock then.
func TestRealRWCrashedReader(t *testing.T) {
	forEachCuttable(t, func(t *testing.T, client func(*testenv.Cutter) redis.UniversalClient) {
		const ttl = 1500 * time.Millisecond
		ctx := ctxT(t)
		res := testenv.Unique("deadreader")
		cut := &testenv.Cutter{}
		deadM := newManager(t, client(cut), manager.WithOwner("dead"), manager.WithTTL(ttl))
		liveM := newManager(t, client(nil), manager.WithOwner("live"))
		writerM := newManager(t, client(nil), manager.WithOwner("writer"))
		start := time.Now()
		if _, err := deadM.TryAcquireRead(ctx, res); err != nil {
			t.Fatal(err)
		}
		acquiredAt := time.Now()
		cut.Cut() // no renewal, no release
		live, err := liveM.TryAcquireRead(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan acquired, 1)
		go func() {
			l, err := writerM.AcquireWrite(ctx, res)
			got <- acquired{l: l, err: err, when: time.Now()}
		}()
		key, _ := sharding.LockKey(sharding.DefaultPrefix, res)
		admin := client(nil)
		eventually(t, 5*time.Second, "the writer queues", func() bool { return admin.HExists(ctx, key, "wq").Val() })
		if err := live.Release(ctx); err != nil {
			t.Fatal(err)
		}
		a := <-got
		if a.err != nil {
			t.Fatal(a.err)
		}
		defer a.l.Release(ctx)
		// The server keeps the share's expiry in whole milliseconds of its
		// clock (the TIME it read, truncated): it may run out up to 1 ms
		// before start+ttl by this process's clock.
		if early := start.Add(ttl).Sub(a.when); early > time.Millisecond {
			t.Fatalf("the writer took the lock %v before the dead reader's share ran out", early)
		}
		late := a.when.Sub(acquiredAt.Add(ttl))
		t.Logf("the writer took the lock %v after the dead reader's TTL (%v)", late, ttl)
		if late > ttl/3 {
			t.Fatalf("the writer took the lock %v after the dead reader's TTL ran out", late)
		}
	})
}

// A constant stream of readers, always one holding the lock, does not
// starve a writer: once it waits, new readers queue behind it, and it takes
// the lock when the readers before it are done. Six goroutines read in
// turn, so at most twelve reads can have begun before the writer queued.
func TestRealRWWriterNotStarved(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		t.Run("fair", func(t *testing.T) { writerNotStarved(t, c) })
		t.Run("polling", func(t *testing.T) { writerNotStarved(t, c, manager.WithNotifications(false)) })
	})
}

func writerNotStarved(t *testing.T, c redis.UniversalClient, opts ...manager.Option) {
	ctx := ctxT(t)
	res := testenv.Unique("starve")
	readersM := []*manager.Manager{newManager(t, c, append(opts, manager.WithOwner("ra"))...), newManager(t, c, append(opts, manager.WithOwner("rb"))...)}
	writerM := newManager(t, c, append(opts, manager.WithOwner("writer"))...)
	stop := make(chan struct{})
	var (
		wg    sync.WaitGroup
		reads atomic.Int64
	)
	started := make(chan struct{}, 6)
	for i := range 6 {
		m := readersM[i%2]
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 5 * time.Millisecond) // staggered: one always holds
			for first := true; ; first = false {
				select {
				case <-stop:
					return
				default:
				}
				l, err := m.AcquireRead(ctx, res, manager.WithWait(10*time.Second))
				if err != nil {
					t.Error(err)
					return
				}
				if first {
					started <- struct{}{}
				}
				reads.Add(1)
				time.Sleep(30 * time.Millisecond)
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for range 6 {
		select {
		case <-started:
		case <-ctx.Done():
			close(stop)
			wg.Wait()
			t.Fatal("the readers did not start")
		}
	}
	before := reads.Load()
	t0 := time.Now()
	w, err := writerM.AcquireWrite(ctx, res, manager.WithWait(5*time.Second))
	waited := time.Since(t0)
	during := reads.Load() - before
	close(stop)
	if err != nil {
		wg.Wait()
		t.Fatalf("the writer starved: %v after %v, %d reads meanwhile", err, waited, during)
	}
	t.Logf("the writer waited %v; %d reads began meanwhile", waited, during)
	// Readers that had begun to acquire as the writer came may still get
	// in; after the writer queued, none.
	if during > 12 {
		t.Errorf("%d reads began while the writer waited (%v): readers barged in ahead of it", during, waited)
	}
	if err := w.Release(ctx); err != nil {
		t.Error(err)
	}
	wg.Wait()
}

// Inspect and List see a read-write lock as one: its readers, its writer's
// owner and fence, its queued waiters; List leaves out one nobody holds.
func TestRealRWInspect(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m := newManager(t, c, manager.WithOwner("inspector"), manager.WithFencing(true))
		ctx := ctxT(t)
		res := testenv.Unique("rwinspect")
		r1, _ := m.TryAcquireRead(ctx, res)
		r2, err := m.TryAcquireRead(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		info, err := m.Inspect(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		if !info.Held || info.Foreign || !info.ReadWrite || info.Readers != 2 || info.Owner != "" {
			t.Fatalf("two readers: %+v", info)
		}
		listed := func() []manager.LockInfo {
			var out []manager.LockInfo
			for i, err := range m.List(ctx, manager.ListOptions{Prefix: res}) {
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, i)
			}
			return out
		}
		if got := listed(); len(got) != 1 || got[0].Readers != 2 || !got[0].ReadWrite {
			t.Fatalf("List with two readers: %+v", got)
		}
		_ = r1.Release(ctx)
		_ = r2.Release(ctx)
		if got := listed(); len(got) != 0 {
			t.Fatalf("List of a read-write lock nobody holds: %+v", got)
		}
		w, err := m.TryAcquireWrite(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		info, _ = m.Inspect(ctx, res)
		if !info.Held || info.Owner != "inspector" || info.Readers != 0 || info.Fence != w.Fence() || info.AcquiredAt.IsZero() {
			t.Fatalf("a writer: %+v (fence %d)", info, w.Fence())
		}
		_ = w.Release(ctx)
	})
}

// The watchdog renews each reader's share past its TTL, and a share that
// is lost (its field gone) is lost on its own: its Done fires, the other
// reader keeps its share.
func TestRealRWWatchdog(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		// A TTL of 1 s: short, yet past the pauses a busy 2-core machine
		// under -race gives a process (see TestRealRWExclusionStress).
		const ttl = time.Second
		m := newManager(t, c, manager.WithTTL(ttl))
		ctx := ctxT(t)
		res := testenv.Unique("rwwd")
		r1, _ := m.TryAcquireRead(ctx, res)
		r2, err := m.TryAcquireRead(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		renewed := func() bool {
			d1, err1 := r1.TTL(ctx)
			d2, err2 := r2.TTL(ctx)
			return err1 == nil && err2 == nil && d1 > 0 && d2 > 0
		}
		// Three TTLs later both shares are alive: renewed.
		deadline := time.Now().Add(3 * ttl)
		for time.Now().Before(deadline) {
			if !renewed() {
				t.Fatal("a reader's share ran out under the watchdog")
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.HDel(ctx, r1.Key(), "r:"+r1.Token())
		waitDone(t, r1, 2*time.Second)
		if !errors.Is(r1.Err(), manager.ErrLockLost) {
			t.Fatalf("lost share: Err = %v", r1.Err())
		}
		if r2.Err() != nil {
			t.Fatalf("the other reader lost its share too: %v", r2.Err())
		}
		if err := r2.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// Bad input to the read-write calls is refused before any round trip.
func TestRWBadInput(t *testing.T) {
	_, c := miniClient(t)
	m := newManager(t, c)
	ctx := ctxT(t)
	for name, call := range map[string]func(context.Context, string, ...manager.AcquireOption) (*manager.Lock, error){
		"AcquireRead": m.AcquireRead, "TryAcquireRead": m.TryAcquireRead, "AcquireWrite": m.AcquireWrite, "TryAcquireWrite": m.TryAcquireWrite,
	} {
		if _, err := call(ctx, ""); !errors.Is(err, manager.ErrInvalidArgument) {
			t.Errorf("%s(\"\") = %v", name, err)
		}
		if _, err := call(ctx, "r", manager.WithTTL(-time.Second)); !errors.Is(err, manager.ErrInvalidArgument) {
			t.Errorf("%s with a negative TTL = %v", name, err)
		}
		if _, err := call(nil, "r"); !errors.Is(err, manager.ErrInvalidArgument) {
			t.Errorf("%s(nil ctx) = %v", name, err)
		}
	}
	_ = m.Close(ctx)
	if _, err := m.AcquireRead(ctx, "r"); !errors.Is(err, manager.ErrClosed) {
		t.Errorf("AcquireRead after Close = %v", err)
	}
}

// ForceRelease leaves a read-write lock alone, as it does any key that does
// not hold a token.
func TestRealRWForceReleaseLeavesIt(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m := newManager(t, c)
		ctx := ctxT(t)
		res := testenv.Unique("rwforce")
		r, err := m.TryAcquireRead(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.ForceRelease(ctx, res, "test"); !errors.Is(err, manager.ErrNotHeld) {
			t.Fatalf("ForceRelease of a read-write lock = %v", err)
		}
		if err := r.Release(ctx); err != nil {
			t.Fatalf("the reader's release after ForceRelease = %v", err)
		}
	})
}

// Under WithReplicaAck a read-write lock's acquire is acknowledged as an
// exclusive lock's is: on the cluster (one replica per master) readers and
// writers see their replica; on the standalone server (none) ReplicaFail
// refuses the lock and gives the share back.
func TestRealRWReplicaAck(t *testing.T) {
	ctx := ctxT(t)
	m := newManager(t, testenv.Cluster(t), manager.WithReplicaAck(1, time.Second, manager.ReplicaFail), manager.WithFencing(true))
	res := testenv.Unique("rwack")
	r, err := m.TryAcquireRead(ctx, res)
	if err != nil || r.Replicas() != 1 {
		t.Fatalf("reader: %v, replicas %d", err, r.Replicas())
	}
	if err := r.Extend(ctx, 5*time.Second); err != nil || r.Replicas() != 1 {
		t.Fatalf("reader Extend = %v, replicas %d", err, r.Replicas())
	}
	_ = r.Release(ctx)
	w, err := m.AcquireWrite(ctx, res)
	if err != nil || w.Replicas() != 1 || w.Fence() == 0 {
		t.Fatalf("writer: %v, %+v", err, w)
	}
	_ = w.Release(ctx)

	sc := testenv.Standalone(t)
	strict := newManager(t, sc, manager.WithReplicaAck(1, 50*time.Millisecond, manager.ReplicaFail))
	res = testenv.Unique("rwack")
	_, err = strict.TryAcquireRead(ctx, res)
	if !errors.Is(err, manager.ErrReplicaAck) {
		t.Fatalf("reader without replicas = %v", err)
	}
	other := newManager(t, sc)
	eventually(t, 5*time.Second, "the unacknowledged share given back", func() bool {
		w, err := other.TryAcquireWrite(ctx, res)
		if err != nil {
			return false
		}
		_ = w.Release(ctx)
		return true
	})
}

// Resume takes exclusive locks only: a read-write lock's token is refused
// with the error of a key that holds another value, and the share is left
// as it is.
func TestRealRWResumeRefused(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m := newManager(t, c)
		other := newManager(t, c)
		ctx := ctxT(t)
		res := testenv.Unique("rwresume")
		r, err := m.TryAcquireRead(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Resume(ctx, res, r.Token()); !errors.Is(err, manager.ErrNotHeld) {
			t.Fatalf("Resume of a reader's token = %v", err)
		}
		if err := r.Release(ctx); err != nil {
			t.Fatalf("the reader's release after a refused Resume = %v", err)
		}
	})
}

// Under WithReplicaAck, a read-write lock's attempt whose reply is lost
// (the script ran, and took the lock) fails with the Redis error, and its
// token goes to the reaper, which gives the lock back: another manager
// takes it long before its TTL.
func TestRealRWReplicaAckLostReply(t *testing.T) {
	ctx := ctxT(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.ClusterAddrs(t)})
	t.Cleanup(func() { _ = c.Close() })
	h := &faultHook{cmd: "eval", lostReply: true}
	h.n.Store(1)
	c.OnNewNode(func(n *redis.Client) { n.AddHook(h) })
	m := newManager(t, c, manager.WithReplicaAck(1, time.Second, manager.ReplicaFail), manager.WithTTL(time.Minute))
	res := testenv.Unique("rwacklost")
	if _, err := m.TryAcquireWrite(ctx, res); err == nil || errors.Is(err, manager.ErrNotAcquired) {
		t.Fatalf("TryAcquireWrite with its reply lost = %v, want the Redis error", err)
	}
	if h.n.Load() == 1 {
		t.Fatal("the fault was not injected")
	}
	other := newManager(t, testenv.Cluster(t))
	eventually(t, 5*time.Second, "the lost attempt's lock given back", func() bool {
		w, err := other.TryAcquireWrite(ctx, res)
		if err != nil {
			return false
		}
		_ = w.Release(ctx)
		return true
	})
}
