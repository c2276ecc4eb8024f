package manager_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/metrics"
)

// forEachCuttable runs f on the standalone server and on the cluster; f
// gets a function that makes a client whose traffic cut (if not nil) cuts.
func forEachCuttable(t *testing.T, f func(t *testing.T, client func(cut *testenv.Cutter) redis.UniversalClient)) {
	for _, target := range testenv.CuttableTargets() {
		t.Run(target.Name, func(t *testing.T) {
			f(t, func(cut *testenv.Cutter) redis.UniversalClient {
				if cut == nil {
					cut = &testenv.Cutter{}
				}
				return target.Client(t, cut)
			})
		})
	}
}

// ownerOf returns the owner id of the token that key holds ("" if none).
func ownerOf(ctx context.Context, c redis.UniversalClient, key string) string {
	info, err := manager.ParseToken(c.Get(ctx, key).Val())
	if err != nil {
		return ""
	}
	return info.Owner
}

// A waiter whose process died while queued is handed the key by the next
// release, but only on the claim lease: the live waiter queued behind it
// takes the key once the lease runs out, long before the TTL. That holds
// for the release of a lock taken uncontended and of one handed over from
// the queue, which on Valkey goes in the conditional commands: those do not
// tell the waiters queued next, and the live waiter finds the key at its
// next re-check (within a second at the default retry strategy's).
func TestRealDeadWaiterCostsOneLease(t *testing.T) {
	forEachCuttable(t, func(t *testing.T, client func(*testenv.Cutter) redis.UniversalClient) {
		for _, handed := range []bool{false, true} {
			t.Run(map[bool]string{false: "taken", true: "handed"}[handed], func(t *testing.T) {
				deadWaiterCostsOneLease(t, client, handed)
			})
		}
	})
}

func deadWaiterCostsOneLease(t *testing.T, client func(*testenv.Cutter) redis.UniversalClient, handed bool) {
	ctx := ctxT(t)
	res := testenv.Unique("deadwaiter")
	admin := client(nil)
	holderM := newManager(t, client(nil), manager.WithOwner("holder"))
	var h *manager.Lock
	if handed {
		first, err := newManager(t, client(nil), manager.WithOwner("first")).TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		h = handOver(t, ctx, admin, first, holderM, res).l
	} else {
		var err error
		if h, err = holderM.TryAcquire(ctx, res); err != nil { // the default TTL: 10 s
			t.Fatal(err)
		}
	}
	key := h.Key()
	deadCtx, cancelDead := context.WithCancel(ctx)
	defer cancelDead()
	deadDone := queueDeadWaiter(t, deadCtx, client, admin, res, key, "dead", 1)
	got := queueLiveWaiter(t, ctx, newManager(t, client(nil), manager.WithOwner("live")), admin, res, key, 2)

	released := time.Now()
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if owner := ownerOf(ctx, admin, key); owner != "dead" && owner != "live" {
		t.Fatalf("after the release the key is %q's", owner)
	}
	a := <-got
	if a.err != nil {
		t.Fatalf("live waiter: %v (the dead waiter held the key for its TTL)", a.err)
	}
	took := a.when.Sub(released)
	t.Logf("the live waiter took the lock %v after the release (claim lease %v, TTL %v)", took, scripts.ClaimLease, manager.DefaultTTL)
	if took > manager.DefaultTTL/4 {
		t.Fatalf("the live waiter waited %v", took)
	}
	if ownerOf(ctx, admin, key) != "live" {
		t.Fatal("the key is not the live waiter's")
	}
	if err := a.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	cancelDead()
	<-deadDone
}

// Two waiters that died while queued one behind the other: the release
// hands the key to the first on its lease and tells the two entries
// queued next, so the live waiter behind them looks when the lease ends
// (its own re-checks are 5 s apart) and takes the key then.
func TestRealTwoDeadWaitersInARowCostOneLease(t *testing.T) {
	forEachCuttable(t, func(t *testing.T, client func(*testenv.Cutter) redis.UniversalClient) {
		ctx := ctxT(t)
		res := testenv.Unique("deadwaiters")
		admin := client(nil)
		holderM := newManager(t, client(nil), manager.WithOwner("holder"))
		h, err := holderM.TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		key := h.Key()
		deadCtx, cancelDead := context.WithCancel(ctx)
		defer cancelDead()
		dead0 := queueDeadWaiter(t, deadCtx, client, admin, res, key, "dead-0", 1)
		dead1 := queueDeadWaiter(t, deadCtx, client, admin, res, key, "dead-1", 2)
		liveM := newManager(t, client(nil), manager.WithOwner("live"), manager.WithRetry(manager.LinearBackoff(5*time.Second)))
		got := queueLiveWaiter(t, ctx, liveM, admin, res, key, 3)

		released := time.Now()
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		a := <-got
		if a.err != nil {
			t.Fatal(a.err)
		}
		took := a.when.Sub(released)
		t.Logf("the live waiter took the lock %v after the release (claim lease %v, its re-checks 5 s apart)", took, scripts.ClaimLease)
		if took > 2500*time.Millisecond {
			t.Fatalf("the live waiter waited %v: it looked at its own re-check, not at the end of the lease", took)
		}
		if err := a.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		cancelDead()
		<-dead0
		<-dead1
	})
}

// queueDeadWaiter starts an Acquire of res (lock key key) by a manager of
// owner on a client of its own, whose traffic is cut once key's queue
// holds n entries (its own the last): it sends nothing more, no give-up,
// no renewal, no release. The returned channel says when that Acquire has
// ended (with ctx).
func queueDeadWaiter(t *testing.T, ctx context.Context, client func(*testenv.Cutter) redis.UniversalClient, admin redis.UniversalClient, res, key, owner string, n int64) <-chan error {
	t.Helper()
	cut := &testenv.Cutter{}
	m := newManager(t, client(cut), manager.WithOwner(owner))
	done := make(chan error, 1)
	go func() {
		_, err := m.Acquire(ctx, res)
		done <- err
	}()
	eventually(t, 5*time.Second, owner+" queued", func() bool { return queueLen(t, admin, key) == n })
	cut.Cut()
	return done
}

// queueLiveWaiter starts m's Acquire of res (lock key key), waiting up to
// 8 s, and returns once key's queue holds n entries (its own the last).
func queueLiveWaiter(t *testing.T, ctx context.Context, m *manager.Manager, admin redis.UniversalClient, res, key string, n int64) <-chan acquired {
	t.Helper()
	got := make(chan acquired, 1)
	go func() {
		l, err := m.Acquire(ctx, res, manager.WithWait(8*time.Second))
		got <- acquired{l: l, err: err, when: time.Now()}
	}()
	eventually(t, 5*time.Second, "live waiter queued", func() bool { return queueLen(t, admin, key) == n })
	return got
}

// A lock handed over on the claim lease is confirmed to its full TTL by its
// first renewal, which is sent even without the watchdog: it is held past
// the lease and released normally.
func TestRealClaimConfirmed(t *testing.T) {
	forEachCuttable(t, func(t *testing.T, client func(*testenv.Cutter) redis.UniversalClient) {
		for _, watchdog := range []bool{false, true} {
			ctx := ctxT(t)
			res := testenv.Unique("claim")
			admin := client(nil)
			holderM := newManager(t, client(nil), manager.WithOwner("holder"))
			waiterM := newManager(t, client(nil), manager.WithOwner("waiter"), manager.WithWatchdog(watchdog))
			h, err := holderM.TryAcquire(ctx, res)
			if err != nil {
				t.Fatal(err)
			}
			a := handOver(t, ctx, admin, h, waiterM, res)
			eventually(t, 5*time.Second, "claim confirmed to the full TTL", func() bool {
				return admin.PTTL(ctx, h.Key()).Val() > 2*scripts.ClaimLease
			})
			if err := a.l.Release(ctx); err != nil {
				t.Fatalf("watchdog %v: release after the lease: %v", watchdog, err)
			}
		}
	})
}

// A lock handed over on the claim lease and released within the first
// quarter of the lease sends no confirmation: the short critical sections of a
// contended resource cost no renewal round trip.
func TestRealClaimShortHoldSendsNoConfirmation(t *testing.T) {
	forEachCuttable(t, func(t *testing.T, client func(*testenv.Cutter) redis.UniversalClient) {
		ctx := ctxT(t)
		res := testenv.Unique("shortclaim")
		admin := client(nil)
		reg := prometheus.NewRegistry()
		mx, err := metrics.New(reg, metrics.Options{})
		if err != nil {
			t.Fatal(err)
		}
		holderM := newManager(t, client(nil), manager.WithOwner("holder"))
		waiterM := newManager(t, client(nil), manager.WithOwner("waiter"), manager.WithMetrics(mx))
		h, err := holderM.TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now() // the waiter's lease is valid from later than this
		a := handOver(t, ctx, admin, h, waiterM, res)
		if pttl := admin.PTTL(ctx, h.Key()).Val(); pttl > scripts.ClaimLease {
			t.Fatalf("the key's TTL is %v right after the hand-over: confirmed at once", pttl)
		}
		if err := a.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		elapsed := time.Since(start)
		renewals := sumSeries(t, reg, "shardlock_renewals_total") + sumSeries(t, reg, "shardlock_renewal_failures_total")
		if elapsed >= scripts.ClaimLease/5 { // the confirmation is due a quarter lease after the first queue write
			t.Logf("released %v after the wait began: a confirmation may have been due (%v renewals)", elapsed, renewals)
			return
		}
		if renewals != 0 {
			t.Fatalf("released %v after the wait began, the lock still sent %v renewals", elapsed, renewals)
		}
	})
}

// sumSeries adds up every series of the counter name in reg (0 when there
// is none yet).
func sumSeries(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, mt := range mf.GetMetric() {
				sum += mt.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// A holder that died leaves its key to its TTL: the waiter queued for it,
// which read the TTL at a re-check, looks again the moment it runs out,
// whatever its retry backoff has grown to.
func TestRealDeadHolderFreeAtTTL(t *testing.T) {
	forEachCuttable(t, func(t *testing.T, client func(*testenv.Cutter) redis.UniversalClient) {
		const ttl = 1500 * time.Millisecond
		ctx := ctxT(t)
		res := testenv.Unique("deadholder")
		admin := client(nil)
		cut := &testenv.Cutter{}
		deadM := newManager(t, client(cut), manager.WithOwner("dead"), manager.WithTTL(ttl))
		liveM := newManager(t, client(nil), manager.WithOwner("live"))
		h, err := deadM.TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		acquiredAt := time.Now()
		cut.Cut() // no renewal, no release
		got := make(chan acquired, 1)
		go func() {
			l, err := liveM.Acquire(ctx, res)
			got <- acquired{l: l, err: err, when: time.Now()}
		}()
		a := <-got
		if a.err != nil {
			t.Fatal(a.err)
		}
		late := a.when.Sub(acquiredAt.Add(ttl))
		t.Logf("the waiter took the dead holder's lock %v after its TTL (%v)", late, ttl)
		if late > ttl/3 {
			t.Fatalf("the waiter took the lock %v after the TTL ran out", late)
		}
		if ownerOf(ctx, admin, h.Key()) != "live" {
			t.Fatal("the key is not the waiter's")
		}
		if err := a.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// A process whose release handed the lock to a waiter queued in Redis
// knows the lock is contended: its next waiting Acquire goes straight to
// the queue (the queue script, or SET NX GET and RPUSHX where the server
// has the conditional commands), with no plain SET NX first.
func TestRealContendedKeyQueuesAtOnce(t *testing.T) {
	ctx := ctxT(t)
	setNX := &matchHook{match: func(cmd redis.Cmder) bool {
		return cmd.Name() == "set" && slices.Contains(cmd.Args(), any("nx")) && !slices.Contains(cmd.Args(), any("get"))
	}}
	c := redis.NewClient(&redis.Options{Addr: testenv.StandaloneAddr(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	c.AddHook(setNX)
	mine := newManager(t, c, manager.WithOwner("mine"))
	other := newManager(t, testenv.Standalone(t), manager.WithOwner("other"))
	res := testenv.Unique("hint")
	l, err := mine.TryAcquire(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan acquired, 1)
	go func() {
		l, err := other.Acquire(ctx, res)
		got <- acquired{l: l, err: err}
	}()
	eventually(t, 5*time.Second, "other queued", func() bool { return queueLen(t, c, l.Key()) == 1 })
	if err := l.Release(ctx); err != nil { // hands it to other
		t.Fatal(err)
	}
	theirs := <-got
	if theirs.err != nil {
		t.Fatal(theirs.err)
	}
	before := setNX.n.Load()
	again := make(chan acquired, 1)
	go func() {
		l, err := mine.Acquire(ctx, res)
		again <- acquired{l: l, err: err}
	}()
	eventually(t, 5*time.Second, "mine queued", func() bool { return queueLen(t, c, l.Key()) == 1 })
	if err := theirs.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-again
	if a.err != nil {
		t.Fatal(a.err)
	}
	if n := setNX.n.Load() - before; n != 0 {
		t.Fatalf("the Acquire of a contended key sent %d SET NX before queueing", n)
	}
	if err := a.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// handOver starts waiterM's Acquire of res, waits until it is queued in
// Redis behind h, releases h, and returns what the Acquire got: the lock,
// handed over on the claim lease.
func handOver(t *testing.T, ctx context.Context, admin redis.UniversalClient, h *manager.Lock, waiterM *manager.Manager, res string) acquired {
	t.Helper()
	got := make(chan acquired, 1)
	go func() {
		l, err := waiterM.Acquire(ctx, res)
		got <- acquired{l: l, err: err}
	}()
	eventually(t, 5*time.Second, "waiter queued", func() bool { return queueLen(t, admin, h.Key()) == 1 })
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.err != nil {
		t.Fatal(a.err)
	}
	return a
}
