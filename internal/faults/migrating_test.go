package faults

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

// tryAgainHook counts the TRYAGAIN replies a node client meets.
// tryAgainHook counts TRYAGAIN replies in n, and those to MSETEX also in
// msetex (when not nil).
type tryAgainHook struct{ n, msetex *atomic.Int64 }

func (h tryAgainHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h tryAgainHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.count(cmd, err)
		return err
	}
}
func (h tryAgainHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.count(c, c.Err())
		}
		return err
	}
}
func (h tryAgainHook) count(cmd redis.Cmder, err error) {
	if err != nil && strings.HasPrefix(err.Error(), "TRYAGAIN") {
		h.n.Add(1)
		if h.msetex != nil && cmd.Name() == "msetex" {
			h.msetex.Add(1)
		}
	}
}

// A waiter that meets its lock's slot migrating cannot queue in Redis: the
// queue script names the waiter queue, which does not exist yet, and Redis
// answers TRYAGAIN to a script whose keys are partly missing from a
// migrating slot. It still takes the lock as soon as the holder releases
// it, while the slot migrates: with the defaults, and with a retry
// strategy so slow that only the release's announcement can wake it.
func TestWaiterThroughMigratingSlot(t *testing.T) {
	addrs := testenv.FaultClusterAddrs(t)
	waitClusterOK(t, addrs, 30*time.Second)
	for _, tc := range []struct {
		name string
		opts []manager.Option
	}{
		{"defaults", nil},
		{"woken by the release", []manager.Option{manager.WithRetry(manager.LinearBackoff(10 * time.Second))}},
	} {
		t.Run(tc.name, func(t *testing.T) { waiterThroughMigratingSlot(t, addrs, tc.opts) })
	}
}

func waiterThroughMigratingSlot(t *testing.T, addrs []string, waiterOpts []manager.Option) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer admin.Close()
	newClient := func(h redis.Hook) *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
		if h != nil {
			c.OnNewNode(func(n *redis.Client) { n.AddHook(h) })
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	holderM, err := manager.New(ctx, newClient(nil), manager.WithOwner("holder"))
	if err != nil {
		t.Fatal(err)
	}
	defer holderM.Close(ctx)
	var tryAgains atomic.Int64
	waiterM, err := manager.New(ctx, newClient(tryAgainHook{n: &tryAgains}), append([]manager.Option{manager.WithOwner("waiter")}, waiterOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer waiterM.Close(ctx)

	res := testenv.Unique("migwait")
	h, err := holderM.TryAcquire(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	slot := sharding.Slot(h.Key())
	src, dst := migrationNodes(t, ctx, admin, slot)
	if err := startMigration(ctx, src, dst, slot); err != nil {
		t.Fatal(err)
	}
	finished := false
	finish := func() {
		if !finished {
			finished = true
			if err := finishMigration(ctx, addrs, src, dst, slot); err != nil {
				t.Errorf("migration: %v", err)
				repairMigration(t, ctx, addrs, src, dst, slot)
			}
		}
	}
	defer finish()

	got := startWaiter(ctx, waiterM, res)
	waitBeforeRelease(t, ctx, got, "the waiter never met TRYAGAIN: the slot is not migrating", func() bool { return tryAgains.Load() > 0 })
	released := time.Now()
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var r waited
	select {
	case r = <-got:
	case <-time.After(3 * time.Second):
		t.Error("the waiter did not take the lock while the slot migrated")
		finish()
		if r = <-got; r.err == nil {
			_ = r.l.Release(ctx)
		}
		return
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("the waiter took the lock %v after the release, the slot migrating (%d TRYAGAIN replies)", time.Since(released), tryAgains.Load())
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A hand-over never creates a fence counter: while a slot migrates key by
// key, a release that runs on the target (its lock key moved there) may
// find the counter still on the source, and a second copy on the target
// would stop the counter's MIGRATE with BUSYKEY. The fenced waiter takes
// the lock itself once the counter has moved, with a higher fence.
func TestHandOverCreatesNoFenceCounter(t *testing.T) {
	ctx, addrs, admin := migrationSetup(t)
	holderM := hookedManager(t, ctx, addrs, nil, manager.WithOwner("holder"), manager.WithFencing(true))
	waiterM := hookedManager(t, ctx, addrs, nil, manager.WithOwner("waiter"), manager.WithFencing(true))

	res := testenv.Unique("migfence")
	h, err := holderM.TryAcquire(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	key := h.Key()
	got := startWaiter(ctx, waiterM, res)
	queue := sharding.QueueKey(key)
	waitBeforeRelease(t, ctx, got, "the waiter never queued", func() bool { return admin.LLen(ctx, queue).Val() == 1 })

	// The lock key and its queue move; the fence counter stays behind.
	slot := sharding.Slot(key)
	src, dst := migrationNodes(t, ctx, admin, slot)
	if err := startMigration(ctx, src, dst, slot); err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(dst.Options().Addr, ":")
	if err := src.Do(ctx, "migrate", host, port, "", 0, 5000, "keys", key, queue).Err(); err != nil {
		t.Fatal(err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// What the release left on the target: no fence counter of its own.
	if err := finishMigration(ctx, addrs, src, dst, slot); err != nil {
		repairMigration(t, ctx, addrs, src, dst, slot)
		t.Fatalf("migration after the release: %v", err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.l.Release(ctx)
	if r.l.Fence() <= h.Fence() {
		t.Fatalf("the waiter's fence %d is not above the holder's %d", r.l.Fence(), h.Fence())
	}
}

// migrationNodes returns clients of the master serving slot and of another
// master: a migration's source and target (closed when the test ends).
func migrationNodes(t *testing.T, ctx context.Context, admin *redis.ClusterClient, slot int) (src, dst *redis.Client) {
	t.Helper()
	source, _ := masterOf(t, ctx, admin, slot)
	src, dst = node(source), node(otherMaster(t, ctx, admin, source))
	t.Cleanup(func() {
		_ = src.Close()
		_ = dst.Close()
	})
	return src, dst
}

// waited is what a waiter's Acquire returned.
type waited struct {
	l   *manager.Lock
	err error
}

// startWaiter runs m's Acquire of res (waiting up to 20 s) in the
// background.
func startWaiter(ctx context.Context, m *manager.Manager, res string) <-chan waited {
	got := make(chan waited, 1)
	go func() {
		l, err := m.Acquire(ctx, res, manager.WithWait(20*time.Second))
		got <- waited{l, err}
	}()
	return got
}

// waitBeforeRelease waits until cond holds, failing if the waiter returns
// first or ctx ends (saying what).
func waitBeforeRelease(t *testing.T, ctx context.Context, got <-chan waited, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case r := <-got:
			t.Fatalf("the waiter returned before the release: %v", r.err)
		case <-ctx.Done():
			t.Fatal(what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// slowSlotsHook delays a node client's CLUSTER SLOTS (how go-redis reads
// the slot map) by 300 ms once armed, so that the cluster client's slot map
// stays behind a migration for that long.
type slowSlotsHook struct{ armed *atomic.Bool }

func (h slowSlotsHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h slowSlotsHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.armed.Load() && cmd.Name() == "cluster" && strings.EqualFold(fmt.Sprint(cmd.Args()[1]), "slots") {
			time.Sleep(300 * time.Millisecond)
		}
		return next(ctx, cmd)
	}
}
func (h slowSlotsHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A waiter's subscription follows its lock's slot: when the slot leaves a
// node, the server drops the subscribers of the slot's channels, and the
// waiter subscribes again on the slot's new node, so that it hears the
// release that hands it the lock. Its slot map stays behind the migration
// for a while (slowSlotsHook): its first SSUBSCRIBE goes to the old node,
// which answers MOVED. A release made before it has subscribed again is
// announced to nobody: once subscribed, the waiter looks, and finds the
// lock handed to it. Its retry strategy is so slow that nothing else can
// wake it in time.
func TestSubscriptionFollowsMigratedSlot(t *testing.T) {
	addrs := testenv.FaultClusterAddrs(t)
	waitClusterOK(t, addrs, 30*time.Second)
	t.Run("released once subscribed again", func(t *testing.T) { subscriptionFollowsSlot(t, addrs, false) })
	t.Run("released before", func(t *testing.T) { subscriptionFollowsSlot(t, addrs, true) })
}

func subscriptionFollowsSlot(t *testing.T, addrs []string, releaseAtOnce bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer admin.Close()
	var slow atomic.Bool
	holderM := hookedManager(t, ctx, addrs, nil, manager.WithOwner("holder"))
	waiterM := hookedManager(t, ctx, addrs, slowSlotsHook{&slow}, manager.WithOwner("waiter"), manager.WithRetry(manager.LinearBackoff(10*time.Second)))

	res := testenv.Unique("migsub")
	h, err := holderM.TryAcquire(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	key := h.Key()
	slot := sharding.Slot(key)
	src, dst := migrationNodes(t, ctx, admin, slot)
	// The waiter's channels: the lock's, and its hand-over channel.
	chs := []any{"pubsub", "shardnumsub", sharding.ChannelName(key), sharding.HandoverChannel(key, "waiter")}
	subscribed := func(c *redis.Client) bool {
		v, err := c.Do(ctx, chs...).Slice()
		return err == nil && len(v) == 4 && v[1] == int64(1) && v[3] == int64(1)
	}
	got := startWaiter(ctx, waiterM, res)
	waitBeforeRelease(t, ctx, got, "the waiter never queued", func() bool {
		return admin.LLen(ctx, sharding.QueueKey(key)).Val() == 1 && subscribed(src)
	})

	slow.Store(true)
	if err := startMigration(ctx, src, dst, slot); err != nil {
		t.Fatal(err)
	}
	if err := finishMigration(ctx, addrs, src, dst, slot); err != nil {
		repairMigration(t, ctx, addrs, src, dst, slot)
		t.Fatalf("migration: %v", err)
	}
	if !releaseAtOnce {
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		defer wcancel()
		waitBeforeRelease(t, wctx, got, "5 s after the migration the waiter is not subscribed on the slot's new node", func() bool { return subscribed(dst) })
	} else if subscribed(dst) {
		t.Fatal("the waiter is subscribed on the new node already: this run tests nothing")
	}
	released := time.Now()
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Logf("the waiter took the lock %v after the release", time.Since(released))
		_ = r.l.Release(ctx)
	case <-time.After(3 * time.Second):
		t.Fatal("the waiter did not take the lock the release handed it")
	}
}

// An unfenced batch is taken while its slot migrates: Redis answers
// TRYAGAIN to the batch script on the slot's target (its keys are not all
// there: free keys are nowhere), and the batch is then taken key by key. A
// batch with a key another owner holds is refused, naming that key, and
// leaves nothing behind.
func TestBatchThroughMigratingSlot(t *testing.T) {
	ctx, addrs, admin := migrationSetup(t)
	var tryAgains, msetexTryAgains atomic.Int64
	m := hookedManager(t, ctx, addrs, tryAgainHook{&tryAgains, &msetexTryAgains}, manager.WithOwner("batch"))
	other := hookedManager(t, ctx, addrs, nil, manager.WithOwner("other"))
	tag := testenv.Unique("migbatch")
	var free, busy []string
	for _, part := range []string{"a", "b", "c"} {
		r, err := sharding.Group(tag, part)
		if err != nil {
			t.Fatal(err)
		}
		free = append(free, r)
		r, err = sharding.Group(tag, "busy-"+part)
		if err != nil {
			t.Fatal(err)
		}
		busy = append(busy, r)
	}
	held, src, dst := migratingUnder(t, ctx, addrs, admin, other, busy[1])

	actx, acancel := context.WithTimeout(ctx, 3*time.Second)
	l, err := m.TryAcquireBatch(actx, free)
	acancel()
	if err != nil {
		t.Fatalf("the free batch, its slot migrating: %v (%d TRYAGAIN replies)", err, tryAgains.Load())
	}
	if tryAgains.Load() == 0 {
		t.Fatal("no TRYAGAIN: the slot is not migrating")
	}
	// Where the masters route MSETEX by slot (Redis 8), the batch's first
	// try is MSETEX: the source's ASK leads it to the target, whose
	// TRYAGAIN sends it to the script.
	if want := os.Getenv("SHARDLOCK_SERVER") == "redis8"; (msetexTryAgains.Load() > 0) != want {
		t.Errorf("%d TRYAGAIN replies to MSETEX, want some: %v", msetexTryAgains.Load(), want)
	}
	for _, k := range l.Keys() {
		if !importedKey(t, ctx, dst, k) {
			t.Errorf("%s is not on the slot's target", k)
		}
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}

	refusedLeavingNothing(t, ctx, m, busy, busy[1], src, dst)
	if v := src.Get(ctx, held.Key()).Val(); v != held.Token() {
		t.Errorf("the held key holds %q, not its holder's token", v)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A MultiLock with a part in a migrating slot is taken, extended and
// released while the slot migrates. Its groups go out in one pipeline per
// node with go-redis's retries off (each call sent once): the source
// answers ASK for the part's free key, and the pipeline follows it to the
// target, where the part is then taken and released.
func TestMultiThroughMigratingSlot(t *testing.T) {
	ctx, addrs, admin := migrationSetup(t)
	replies := &workload{}
	m := hookedManager(t, ctx, addrs, replyHook{replies}, manager.WithOwner("multi"))
	other := hookedManager(t, ctx, addrs, nil, manager.WithOwner("other"))
	tag := testenv.Unique("migmulti")
	moving, busy := "{"+tag+"}:moving", "{"+tag+"}:busy" // one slot
	staying := testenv.Unique("migmulti-stays")
	movingKey, _ := sharding.LockKey(sharding.DefaultPrefix, moving)
	stayingKey, _ := sharding.LockKey(sharding.DefaultPrefix, staying)
	if sharding.Slot(movingKey) == sharding.Slot(stayingKey) {
		t.Fatal("the two parts share a slot")
	}
	held, src, dst := migratingUnder(t, ctx, addrs, admin, other, busy)

	actx, acancel := context.WithTimeout(ctx, 3*time.Second)
	ml, err := m.TryAcquireMulti(actx, []string{moving, staying})
	acancel()
	if err != nil {
		t.Fatalf("the MultiLock, a part's slot migrating: %v (replies met: %v)", err, replies.replies)
	}
	if replies.saw("ASK") == 0 {
		t.Fatalf("no ASK met: the slot is not migrating (replies met: %v)", replies.replies)
	}
	if !importedKey(t, ctx, dst, movingKey) {
		t.Errorf("%s is not on the slot's target", movingKey)
	}
	if n := src.Exists(ctx, movingKey).Val(); n != 0 {
		t.Errorf("%s is on the slot's source too", movingKey)
	}
	if err := ml.Extend(ctx, 5*time.Second); err != nil {
		t.Fatalf("extend: %v", err)
	}
	if err := ml.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	if importedKey(t, ctx, dst, movingKey) {
		t.Errorf("%s is still on the slot's target after the release", movingKey)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A fenced lock or batch whose slot migrates is taken while the slot is in
// MIGRATING/IMPORTING, whether its fence counters are still on the source
// or already on the target: Redis answers TRYAGAIN to the fenced acquire
// script (the free key is on neither node, the counter on one), and the
// acquire then takes the keys alone and each fence where its counter is.
// Each counter stays on one node, holds the fence it handed out, and the
// migration ends without a key that is on both nodes.
func TestFencedThroughMigratingSlot(t *testing.T) {
	ctx, addrs, admin := migrationSetup(t)
	var tryAgains atomic.Int64
	m := hookedManager(t, ctx, addrs, tryAgainHook{n: &tryAgains}, manager.WithOwner("fenced"), manager.WithFencing(true))
	other := hookedManager(t, ctx, addrs, nil, manager.WithOwner("other"), manager.WithFencing(true))
	tag := testenv.Unique("migfenced")
	group := func(parts ...string) []string {
		t.Helper()
		var rs []string
		for _, p := range parts {
			r, err := sharding.Group(tag, p)
			if err != nil {
				t.Fatal(err)
			}
			rs = append(rs, r)
		}
		return rs
	}
	singles, batch, busy := group("stays", "moves"), group("a", "b", "c"), group("busy-a", "busy-b")
	fenceKey := func(r string) string {
		k, _ := sharding.LockKey(sharding.DefaultPrefix, r)
		return sharding.FenceKey(k)
	}
	// Fences taken before the migration, on the source: every counter exists.
	before := map[string]uint64{}
	for _, r := range singles {
		l, err := m.TryAcquire(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		before[r] = l.Fence()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, rs := range [][]string{batch, busy} {
		l, err := m.TryAcquireBatch(ctx, rs)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range rs {
			before[r] = l.Fences()[i]
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	held, src, dst := migratingUnder(t, ctx, addrs, admin, other, busy[1])
	// Two counters go ahead to the target; the others stay on the source.
	host, port, _ := strings.Cut(dst.Options().Addr, ":")
	if err := src.Do(ctx, "migrate", host, port, "", 0, 5000, "keys", fenceKey(singles[1]), fenceKey(batch[1])).Err(); err != nil {
		t.Fatal(err)
	}
	// onOneNode checks that r's counter is on one node and holds fence.
	onOneNode := func(r string, fence uint64) {
		t.Helper()
		fk := fenceKey(r)
		onSrc, onDst := src.Exists(ctx, fk).Val() == 1, importedKey(t, ctx, dst, fk)
		if onSrc == onDst {
			t.Fatalf("%s: on the source %v, on the target %v; want it on one", fk, onSrc, onDst)
		}
		if fence <= before[r] {
			t.Errorf("%s: fence %d, not above %d, taken before the migration", r, fence, before[r])
		}
		c := src
		if onDst {
			var get *redis.StringCmd
			if _, err := dst.Pipelined(ctx, func(p redis.Pipeliner) error {
				p.Do(ctx, "asking")
				get = p.Get(ctx, fk)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if got, _ := get.Uint64(); got != fence {
				t.Errorf("%s on the target holds %d, not the fence %d", fk, got, fence)
			}
			return
		}
		if got, _ := c.Get(ctx, fk).Uint64(); got != fence {
			t.Errorf("%s on the source holds %d, not the fence %d", fk, got, fence)
		}
	}

	for _, r := range singles {
		actx, acancel := context.WithTimeout(ctx, 3*time.Second)
		l, err := m.TryAcquire(actx, r)
		acancel()
		if err != nil {
			t.Fatalf("fenced %s, its slot migrating: %v (%d TRYAGAIN replies)", r, err, tryAgains.Load())
		}
		onOneNode(r, l.Fence())
		if !importedKey(t, ctx, dst, l.Key()) {
			t.Errorf("%s is not on the slot's target", l.Key())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("release: %v", err)
		}
	}
	if tryAgains.Load() == 0 {
		t.Fatal("no TRYAGAIN: the slot is not migrating")
	}
	actx, acancel := context.WithTimeout(ctx, 3*time.Second)
	l, err := m.TryAcquireBatch(actx, batch)
	acancel()
	if err != nil {
		t.Fatalf("the fenced batch, its slot migrating: %v", err)
	}
	for i, r := range batch {
		onOneNode(r, l.Fences()[i])
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}

	refusedLeavingNothing(t, ctx, m, busy, busy[1], src, dst)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// refusedLeavingNothing checks that m's batch of resources, of which held
// is someone else's, is refused naming held, and leaves none of the other
// keys on src or dst (a migration's source and target).
func refusedLeavingNothing(t *testing.T, ctx context.Context, m *manager.Manager, resources []string, held string, src, dst *redis.Client) {
	t.Helper()
	actx, acancel := context.WithTimeout(ctx, 3*time.Second)
	_, err := m.TryAcquireBatch(actx, resources)
	acancel()
	var heldErr *manager.BatchHeldError
	if !errors.As(err, &heldErr) || len(heldErr.Held) != 1 || heldErr.Held[0] != held {
		t.Fatalf("the batch with a held key = %v, want a BatchHeldError naming %s", err, held)
	}
	for _, r := range resources {
		if r == held {
			continue
		}
		k, _ := sharding.LockKey(sharding.DefaultPrefix, r)
		if src.Exists(ctx, k).Val() != 0 || importedKey(t, ctx, dst, k) {
			t.Errorf("%s was left behind", k)
		}
	}
}

// migratingUnder takes resource with m and puts its slot in migration
// (startMigration), which ends when the test does (finishMigration, or
// repairMigration if that fails). It returns the lock and the migration's
// source and target.
func migratingUnder(t *testing.T, ctx context.Context, addrs []string, admin *redis.ClusterClient, m *manager.Manager, resource string) (held *manager.Lock, src, dst *redis.Client) {
	t.Helper()
	held, err := m.TryAcquire(ctx, resource)
	if err != nil {
		t.Fatal(err)
	}
	slot := sharding.Slot(held.Key())
	src, dst = migrationNodes(t, ctx, admin, slot)
	if err := startMigration(ctx, src, dst, slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := finishMigration(ctx, addrs, src, dst, slot); err != nil {
			t.Errorf("migration: %v", err)
			repairMigration(t, ctx, addrs, src, dst, slot)
		}
	})
	return held, src, dst
}

// importedKey reports whether key is on dst, the target of its migrating
// slot (ASKING and EXISTS on one connection).
func importedKey(t *testing.T, ctx context.Context, dst *redis.Client, key string) bool {
	t.Helper()
	var exists *redis.IntCmd
	if _, err := dst.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "asking")
		exists = p.Exists(ctx, key)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return exists.Val() == 1
}

// While a slot migrates, its target lets a script create any key of the
// slot, though the source may still have it, and a second copy stops
// MIGRATE with BUSYKEY. No lock call makes one: a lock released on the
// source and then taken and released again on the target (alone, in a
// batch, with a waiter that marked its key) leaves its release record on
// the source only; a lock forced on both sides, its forced record on the
// source only; and a lock forced on the source while its slot migrates is
// forced there (with no record when the record is not there: the source
// refuses keys it no longer has). The migration then moves every key
// without replacing any.
func TestMigrationMeetsNoKeyTwice(t *testing.T) {
	ctx, addrs, admin := migrationSetup(t)
	m := hookedManager(t, ctx, addrs, nil)
	other := hookedManager(t, ctx, addrs, nil) // another process: waits, forces
	tag := testenv.Unique("migtwice")
	res := func(part string) string {
		r, _ := sharding.Group(tag, part)
		return r
	}
	key := func(r string) string {
		k, _ := sharding.LockKey(sharding.DefaultPrefix, r)
		return k
	}
	var dst *redis.Client // set once the slot migrates: the node that has the keys taken since
	value := func(k string) string {
		if dst == nil {
			return admin.Get(ctx, k).Val()
		}
		var get *redis.StringCmd
		_, _ = dst.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Do(ctx, "asking")
			get = p.Get(ctx, k)
			return nil
		})
		return get.Val()
	}
	cycle := func(where string) {
		t.Helper()
		l, err := m.TryAcquire(ctx, res("single"))
		if err != nil {
			t.Fatal(where, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(where, err)
		}
		b, err := m.TryAcquireBatch(ctx, []string{res("a"), res("b")})
		if err != nil {
			t.Fatal(where, err)
		}
		if err := b.Release(ctx); err != nil {
			t.Fatal(where, err)
		}
		h, err := m.TryAcquire(ctx, res("waited"))
		if err != nil {
			t.Fatal(where, err)
		}
		got := startWaiter(ctx, other, res("waited"))
		waitBeforeRelease(t, ctx, got, where+": the waiter did not mark the key", func() bool {
			return strings.HasSuffix(value(key(res("waited"))), sharding.QueuedMark)
		})
		if err := h.Release(ctx); err != nil {
			t.Fatal(where, err)
		}
		w := <-got
		if w.err != nil {
			t.Fatal(where, "waiter:", w.err)
		}
		if err := w.l.Release(ctx); err != nil {
			t.Fatal(where, err)
		}
		f, err := m.TryAcquire(ctx, res("evicted"))
		if err != nil {
			t.Fatal(where, err)
		}
		if err := other.ForceRelease(ctx, res("evicted"), "test"); err != nil {
			t.Fatal(where, "force:", err)
		}
		if err := f.Release(ctx); !errors.Is(err, manager.ErrForceReleased) && !errors.Is(err, manager.ErrLockLost) {
			t.Fatal(where, "release of a forced lock:", err)
		}
	}
	cycle("on the source")
	// The slot migrates from here to the end of the test, which moves
	// its keys with plain MIGRATE (finishMigration).
	held, _, target := migratingUnder(t, ctx, addrs, admin, m, res("held"))
	dst = target
	cycle("on the target")
	if err := other.ForceRelease(ctx, res("held"), "test"); err != nil {
		t.Fatal("force on the migrating source:", err)
	}
	_ = held.Release(ctx)
}

// hookedManager returns a manager with opts on its own client of the
// cluster at addrs (ContextTimeoutEnabled), whose node clients get hook h
// unless it is nil; both are closed at cleanup.
func hookedManager(t *testing.T, ctx context.Context, addrs []string, h redis.Hook, opts ...manager.Option) *manager.Manager {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	if h != nil {
		c.OnNewNode(func(n *redis.Client) { n.AddHook(h) })
	}
	t.Cleanup(func() { _ = c.Close() })
	m, err := manager.New(ctx, c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m
}

// migrationSetup waits for the fault cluster to be whole and returns a
// context bounding the test (30 s), the cluster's addresses and an admin
// client, closed at cleanup.
func migrationSetup(t *testing.T) (context.Context, []string, *redis.ClusterClient) {
	t.Helper()
	addrs := testenv.FaultClusterAddrs(t)
	waitClusterOK(t, addrs, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = admin.Close() })
	return ctx, addrs, admin
}

// Every call on a lock works while its slot migrates, on a lock whose key
// is on the source (taken before) and on one taken on the target:
// TTL, Extend, Inspect (each key read where it is: the target's after
// ASKING), Resume, and a leadership's Campaign and Leader. Inspect failed
// with the source's ASK reply for every key the source no longer had.
func TestCallsThroughMigratingSlot(t *testing.T) {
	ctx, addrs, admin := migrationSetup(t)
	m := hookedManager(t, ctx, addrs, nil)
	tag := testenv.Unique("migcalls")
	res := func(part string) string {
		r, _ := sharding.Group(tag, part)
		return r
	}
	fenced := manager.WithFencing(true)
	onSource, err := m.TryAcquire(ctx, res("source"), fenced)
	if err != nil {
		t.Fatal(err)
	}
	readOnSource, err := m.TryAcquireRead(ctx, "rw:"+res("rsource"))
	if err != nil {
		t.Fatal(err)
	}
	held, _, dst := migratingUnder(t, ctx, addrs, admin, m, res("held"))
	onTarget, err := m.TryAcquire(ctx, res("target"), fenced)
	if err != nil {
		t.Fatal(err)
	}
	readOnTarget, err := m.TryAcquireRead(ctx, "rw:"+res("rtarget"))
	if err != nil {
		t.Fatal(err)
	}
	if !importedKey(t, ctx, dst, onTarget.Key()) || !importedKey(t, ctx, dst, readOnTarget.Key()) {
		t.Fatal("the locks taken while the slot migrates are not on its target")
	}
	for _, l := range []*manager.Lock{onSource, readOnSource, onTarget, readOnTarget} {
		if _, err := l.TTL(ctx); err != nil {
			t.Errorf("TTL of %s: %v", l.Resource(), err)
		}
		if err := l.Extend(ctx, 20*time.Second); err != nil {
			t.Errorf("Extend of %s: %v", l.Resource(), err)
		}
		info, err := m.Inspect(ctx, l.Resource())
		if err != nil {
			t.Errorf("Inspect of %s: %v", l.Resource(), err)
		} else if !info.Held || info.Fence != l.Fence() || info.TTL <= 10*time.Second {
			t.Errorf("Inspect of %s: held %v, fence %d (lock's %d), TTL %v, want held, the lock's fence, above 10 s",
				l.Resource(), info.Held, info.Fence, l.Fence(), info.TTL)
		}
	}
	if info, err := m.Inspect(ctx, res("free")); err != nil || info.Held {
		t.Errorf("Inspect of a free lock: %+v, %v", info, err)
	}
	other := hookedManager(t, ctx, addrs, nil)
	for _, l := range []*manager.Lock{onSource, onTarget} {
		r, err := other.Resume(ctx, l.Resource(), l.Token(), fenced)
		if err != nil {
			t.Errorf("Resume of %s: %v", l.Resource(), err)
			continue
		}
		if r.Fence() != l.Fence() {
			t.Errorf("Resume of %s: fence %d, want %d", l.Resource(), r.Fence(), l.Fence())
		}
		_ = r.Forget()
	}
	ld, err := m.Campaign(ctx, res("leader"))
	if err != nil {
		t.Fatal("Campaign:", err)
	}
	if li, err := other.Leader(ctx, res("leader")); err != nil || li.Term != ld.Term() {
		t.Errorf("Leader: %+v, %v; want term %d", li, err, ld.Term())
	}
	if err := ld.Resign(ctx); err != nil {
		t.Errorf("Resign: %v", err)
	}
	for _, l := range []*manager.Lock{onSource, readOnSource, onTarget, readOnTarget, held} {
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release of %s: %v", l.Resource(), err)
		}
	}
}

// A batch whose client still sends its slot's commands to the master that
// served the slot before it moved is taken on the slot's new master, and
// leaves no key on the former one, on every server. The former master
// refuses the first try: MSETEX alone where the masters route it (Redis
// 8), and where they do not (a Valkey 9.1 node runs MSETEX of any slot), a
// transaction whose EXISTS of the batch's keys the node routes; the
// script elsewhere. The script then follows the redirect.
func TestBatchOnAStaleSlotMap(t *testing.T) {
	ctx, addrs, admin := migrationSetup(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	m, err := manager.New(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	tag := testenv.Unique("stalebatch")
	var res []string
	for _, part := range []string{"a", "b", "c"} {
		r, err := sharding.Group(tag, part)
		if err != nil {
			t.Fatal(err)
		}
		res = append(res, r)
	}
	key, _ := sharding.LockKey(sharding.DefaultPrefix, res[0])
	slot := sharding.Slot(key)
	// The client learns where the slot is.
	l, err := m.TryAcquireBatch(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	src, dst := migrationNodes(t, ctx, admin, slot)
	// The slot, empty now, moves to dst behind the client's back.
	if err := startMigration(ctx, src, dst, slot); err != nil {
		t.Fatal(err)
	}
	if err := finishMigration(ctx, addrs, src, dst, slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := startMigration(ctx, dst, src, slot); err != nil {
			t.Errorf("moving slot %d back: %v", slot, err)
		} else if err := finishMigration(ctx, addrs, dst, src, slot); err != nil {
			t.Errorf("moving slot %d back: %v", slot, err)
		}
	})
	if n, err := c.MasterForKey(ctx, key); err != nil || n.Options().Addr != src.Options().Addr {
		t.Fatalf("the client does not route the slot to its former master (%v): nothing to test", err)
	}

	l, err = m.TryAcquireBatch(ctx, res)
	if err != nil {
		t.Fatalf("the batch, its slot moved: %v", err)
	}
	if n := src.ClusterCountKeysInSlot(ctx, slot).Val(); n != 0 {
		t.Errorf("the slot's former master holds %d keys of the slot", n)
	}
	if n := dst.ClusterCountKeysInSlot(ctx, slot).Val(); n != int64(len(res)) {
		t.Errorf("the slot's master holds %d keys of the slot, want %d", n, len(res))
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
