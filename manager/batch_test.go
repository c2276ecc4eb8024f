package manager_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

func group(t testing.TB, g string, parts ...string) []string {
	t.Helper()
	out := make([]string, len(parts))
	for i, p := range parts {
		var err error
		if out[i], err = sharding.Group(g, p); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestBatchBadInputMakesNoRoundTrip(t *testing.T) {
	_, c := miniClient(t)
	hook := &faultHook{}
	c.AddHook(hook)
	m := newManager(t, c, manager.WithCoalescing(false))
	ctx := ctxT(t)
	before := hook.seen.Load()
	many := make([]string, manager.MaxBatch+1)
	for i := range many {
		many[i], _ = sharding.Group("g", fmt.Sprint(i))
	}
	tests := []struct {
		name string
		give []string
	}{
		{"empty", nil},
		{"too many", many},
		{"duplicate", []string{"{g}:a", "{g}:a"}},
		{"bad resource", []string{"{g}:a", "a}b"}},
	}
	for _, tt := range tests {
		if _, err := m.TryAcquireBatch(ctx, tt.give); !errors.Is(err, manager.ErrInvalidArgument) {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
	_, err := m.TryAcquireBatch(ctx, []string{"order:1", "order:2"})
	var cse *manager.CrossSlotError
	if !errors.As(err, &cse) || !errors.Is(err, manager.ErrCrossSlot) || len(cse.Slots) != 2 {
		t.Fatalf("cross-slot batch: %v", err)
	}
	if n := hook.seen.Load() - before; n != 0 {
		t.Fatalf("bad batches sent %d commands", n)
	}
}

func TestBatchAllOrNothing(t *testing.T) {
	mr, c := miniClient(t)
	m := newManager(t, c, manager.WithFencing(true))
	ctx := ctxT(t)
	res := group(t, "order:123", "stock", "payment", "shipping")

	// One resource held elsewhere: nothing of the batch is taken.
	single, err := m.TryAcquire(ctx, res[1])
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.TryAcquireBatch(ctx, res)
	var bhe *manager.BatchHeldError
	if !errors.As(err, &bhe) || !errors.Is(err, manager.ErrNotAcquired) || len(bhe.Held) != 1 || bhe.Held[0] != res[1] {
		t.Fatalf("batch over a held resource: %v", err)
	}
	for _, r := range []string{res[0], res[2]} {
		if mr.Exists("shardlock:" + r) {
			t.Fatalf("%s was taken by a failed batch", r)
		}
	}
	_ = single.Release(ctx)

	l, err := m.TryAcquireBatch(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Resources(); strings.Join(got, ",") != strings.Join(res, ",") {
		t.Fatalf("Resources = %v", got)
	}
	for _, k := range l.Keys() {
		if v, _ := mr.Get(k); v != l.Token() {
			t.Fatalf("%s holds %q", k, v)
		}
	}
	if f := l.Fences(); len(f) != 3 || f[0] == 0 || f[1] <= single.Fence() || l.Fence() != f[0] {
		t.Fatalf("fences %v (fence %d)", f, l.Fence())
	}
	if err := l.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if d, err := l.TTL(ctx); err != nil || d < 50*time.Second {
		t.Fatalf("TTL %v %v", d, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range l.Keys() {
		if mr.Exists(k) {
			t.Fatalf("%s left after Release", k)
		}
	}
}

func TestBatchReleaseReportsPerResource(t *testing.T) {
	mr, c := miniClient(t)
	m := newManager(t, c, manager.WithWatchdog(false))
	ctx := ctxT(t)
	res := group(t, "g", "a", "b", "c")
	l, err := m.TryAcquireBatch(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	keys := l.Keys()
	mr.Set(keys[1], "thief")
	mr.Del(keys[2])
	err = l.Release(ctx)
	var bre *manager.BatchReleaseError
	if !errors.As(err, &bre) || !errors.Is(err, manager.ErrNotHeld) {
		t.Fatalf("Release = %v", err)
	}
	if !errors.Is(bre.Results[res[1]], manager.ErrNotHeld) || !errors.Is(bre.Results[res[2]], manager.ErrExpired) || bre.Results[res[0]] != nil {
		t.Fatalf("results %v", bre.Results)
	}
	if mr.Exists(keys[0]) {
		t.Fatal("the key still held was not deleted")
	}
	if v, _ := mr.Get(keys[1]); v != "thief" {
		t.Fatal("another owner's key was deleted")
	}
}

func TestBatchLostAsAWhole(t *testing.T) {
	mr, c := miniClient(t)
	m := newManager(t, c, manager.WithTTL(3*time.Second), manager.WithRenewInterval(20*time.Millisecond))
	ctx := ctxT(t)
	l, err := m.TryAcquireBatch(ctx, group(t, "g", "a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	mr.Del(l.Keys()[1])
	waitDone(t, l, 2*time.Second)
	if !errors.Is(l.Err(), manager.ErrLockLost) || !errors.Is(l.Err(), manager.ErrExpired) {
		t.Fatalf("Err = %v", l.Err())
	}
	if v, _ := mr.Get(l.Keys()[0]); v != l.Token() {
		t.Fatal("a lost batch's renewal touched the other key")
	}
}

func TestRealBatch(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m := newManager(t, c, manager.WithTTL(300*time.Millisecond), manager.WithFencing(true))
		ctx := ctxT(t)
		res := group(t, testenv.Unique("order"), "stock", "payment", "invoice")
		l, err := m.AcquireBatch(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.TryAcquire(ctx, res[2]); !errors.Is(err, manager.ErrNotAcquired) {
			t.Fatalf("a batch member taken alone: %v", err)
		}
		// The watchdog renews all keys well past the TTL.
		select {
		case <-l.Done():
			t.Fatalf("lost: %v", l.Err())
		case <-time.After(time.Second):
		}
		for _, k := range l.Keys() {
			if pttl := c.PTTL(ctx, k).Val(); pttl <= 0 {
				t.Fatalf("%s PTTL %v", k, pttl)
			}
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		for _, k := range l.Keys() {
			if c.Exists(ctx, k).Val() != 0 {
				t.Fatalf("%s left", k)
			}
		}
		// Cross-slot resources are refused before any round trip.
		if _, err := m.TryAcquireBatch(ctx, []string{"x:1", "x:2"}); !errors.Is(err, manager.ErrCrossSlot) {
			t.Fatalf("cross-slot: %v", err)
		}
	})
}

// sameSlotTag returns a tag other than tag whose slot is tag's.
func sameSlotTag(t testing.TB, tag string) string {
	t.Helper()
	want := sharding.Slot("{" + tag + "}")
	for i := range 1 << 20 {
		other := fmt.Sprintf("%s-%d", tag, i)
		if sharding.Slot("{"+other+"}") == want {
			return other
		}
	}
	t.Fatalf("no tag shares %q's slot", tag)
	return ""
}

func TestRealBatchOfTagsInOneSlot(t *testing.T) {
	c := testenv.Cluster(t)
	m := newManager(t, c)
	ctx := ctxT(t)
	tag := testenv.Unique("tags")
	other := sameSlotTag(t, tag)
	// Different hash tags in one slot are one batch: Redis runs the script.
	res := []string{"{" + tag + "}:a", "{" + other + "}:b", "{" + tag + "}:c"}
	l, err := m.TryAcquireBatch(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A third tag in another slot is refused before any round trip.
	far := tag + "-far"
	for i := 0; i < 16 && sharding.Slot("{"+far+"}") == sharding.Slot("{"+tag+"}"); i++ {
		far += "x"
	}
	_, err = m.TryAcquireBatch(ctx, append(res, "{"+far+"}:d"))
	var cse *manager.CrossSlotError
	if !errors.As(err, &cse) || len(cse.Slots) != 4 {
		t.Fatalf("a batch over two slots: %v", err)
	}
}

func TestRealBatchReplicaAck(t *testing.T) {
	c := testenv.Cluster(t)
	m := newManager(t, c, manager.WithReplicaAck(1, time.Second, manager.ReplicaFail))
	ctx := ctxT(t)
	l, err := m.TryAcquireBatch(ctx, group(t, testenv.Unique("g"), "a", "b"))
	if err != nil || l.Replicas() != 1 {
		t.Fatalf("batch with WAIT: %v, replicas %d", err, l.Replicas())
	}
	if err := l.Extend(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// The batch script on the real servers. A first attempt sets the keys as
// free ones and, when a later key is busy, undoes what it set: whichever key
// is busy, the batch fails naming it and leaves every other key absent. A
// re-sent first attempt finds its token in every key and holds the batch.
func TestRealBatchFirstAttempt(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		hook := &resendHook{name: "evalsha"}
		c.AddHook(hook)
		m := newManager(t, c, manager.WithWatchdog(false), manager.WithCoalescing(false))
		other := newManager(t, c, manager.WithWatchdog(false))
		ctx := ctxT(t)
		res := group(t, testenv.Unique("first"), "a", "b", "c", "d")
		keys := make([]string, len(res))
		for i, r := range res {
			keys[i], _ = sharding.LockKey(sharding.DefaultPrefix, r)
		}
		hook.n.Store(2) // no re-send yet
		for busy := range res {
			h, err := other.TryAcquire(ctx, res[busy])
			if err != nil {
				t.Fatal(err)
			}
			_, err = m.TryAcquireBatch(ctx, res)
			var bhe *manager.BatchHeldError
			if !errors.As(err, &bhe) || len(bhe.Held) != 1 || bhe.Held[0] != res[busy] {
				t.Fatalf("key %d busy: %v", busy, err)
			}
			for i, k := range keys {
				if i != busy && c.Exists(ctx, k).Val() != 0 {
					t.Fatalf("key %d busy: key %d left set by the failed batch", busy, i)
				}
			}
			if v := c.Get(ctx, keys[busy]).Val(); v != h.Token() {
				t.Fatalf("key %d busy: the holder's key now holds %q", busy, v)
			}
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		hook.n.Store(0) // the next script runs twice
		l, err := m.TryAcquireBatch(ctx, res, manager.WithFencing(true))
		if err != nil {
			t.Fatalf("batch after a re-sent script: %v", err)
		}
		if f := l.Fences(); len(f) != len(res) || f[0] == 0 {
			t.Fatalf("fences %v", f)
		}
		for _, k := range keys {
			if v := c.Get(ctx, k).Val(); v != l.Token() {
				t.Fatalf("%s holds %q", k, v)
			}
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// shardSubscribers returns how many clients are subscribed to the channel
// of the lock at key, on the master serving it.
func shardSubscribers(t *testing.T, c redis.UniversalClient, key string) int64 {
	t.Helper()
	ctx := context.Background()
	var node interface {
		Do(context.Context, ...any) *redis.Cmd
	} = c
	if cc, ok := c.(*redis.ClusterClient); ok {
		n, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		node = n
	}
	res, err := node.Do(ctx, "pubsub", "shardnumsub", sharding.ChannelName(key)).Slice()
	if err != nil || len(res) != 2 {
		t.Fatalf("PUBSUB SHARDNUMSUB: %v %v", res, err)
	}
	n, _ := res[1].(int64)
	return n
}

// A waiting batch marks the keys others hold and is woken by their
// release, well before its 5 s re-check: the release of a single lock
// (release.lua), of a batch (release_batch.lua), and of both, one after the
// other. The holders' locks work as before while marked.
func TestRealBatchWaiterWokenByRelease(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		for _, held := range []string{"single", "batch", "single+batch"} {
			t.Run(held, func(t *testing.T) { testBatchWaiterWoken(t, c, strings.Split(held, "+")) })
		}
	})
}

func testBatchWaiterWoken(t *testing.T, c redis.UniversalClient, held []string) {
	ctx := ctxT(t)
	res := group(t, testenv.Unique("wake"), "a", "b", "c", "d")
	holders := newManager(t, c)
	waiter := newManager(t, c, slowRecheck)
	var locks []*manager.Lock
	for _, h := range held {
		var l *manager.Lock
		var err error
		if h == "single" {
			l, err = holders.TryAcquire(ctx, res[1])
		} else {
			l, err = holders.TryAcquireBatch(ctx, res[2:])
		}
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, l)
	}
	got := make(chan acquired, 1)
	go func() {
		l, err := waiter.AcquireBatch(ctx, res)
		got <- acquired{l: l, err: err, when: time.Now()}
	}()
	for _, l := range locks {
		for _, k := range l.Keys() {
			eventually(t, 5*time.Second, "waiter watching "+k, func() bool {
				return shardSubscribers(t, c, k) >= 1 && strings.HasSuffix(c.Get(ctx, k).Val(), sharding.QueuedMark)
			})
		}
		// The holder's lock, marked, renews and reports its TTL.
		if err := l.Extend(ctx, 20*time.Second); err != nil {
			t.Fatalf("extend while marked: %v", err)
		}
		if ttl, err := l.TTL(ctx); err != nil || ttl <= 10*time.Second {
			t.Fatalf("TTL while marked: %v %v", ttl, err)
		}
	}
	var released time.Time
	for i, l := range locks {
		if i == len(locks)-1 {
			released = time.Now()
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	// The re-check is 5 s away: well under it means the release woke it.
	if waited := r.when.Sub(released); waited > 2*time.Second {
		t.Fatalf("acquired %v after the last release: it re-checked instead of being woken", waited)
	}
	for _, k := range r.l.Keys() {
		if v := c.Get(ctx, k).Val(); v != r.l.Token() {
			t.Fatalf("%s holds %q", k, v)
		}
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A batch contended by 20 goroutines of 4 managers, at the defaults: a
// waiter is woken by every release of a key it waits for, and loses most
// of those races; the attempts it makes when woken are not the default
// strategy's, so none of them gives up long before DefaultWait.
func TestRealBatchContendedAtDefaults(t *testing.T) {
	c := testenv.Cluster(t)
	res := group(t, testenv.Unique("herd"), "a", "b", "c")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	var ms []*manager.Manager
	for range 4 {
		ms = append(ms, newManager(t, c))
	}
	errs := make(chan error, 20)
	start := time.Now()
	counts := make(chan int, 20)
	for g := range 20 {
		m := ms[g%4]
		go func() {
			n := 0
			defer func() { counts <- n }()
			for ctx.Err() == nil {
				l, err := m.AcquireBatch(ctx, res)
				if err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("after %v: %w", time.Since(start).Round(time.Millisecond), err)
					}
					return
				}
				n++
				time.Sleep(time.Millisecond)
				_ = l.Release(context.Background())
			}
		}()
	}
	total := 0
	for range 20 {
		total += <-counts
	}
	close(errs)
	for err := range errs {
		t.Errorf("a waiter gave up before its deadline, %v", err)
	}
	t.Logf("%d acquisitions of the batch in 4 s", total)
}

// The batch scripts answer their fast paths (a free unfenced batch taken,
// every key released) with a bare integer, which costs the server less
// than a table, and every other outcome with a table; a batch taken and
// released either way reads its outcome right.
func TestRealBatchScriptReplies(t *testing.T) {
	c := testenv.Standalone(t)
	ctx := ctxT(t)
	g := testenv.Unique("replies")
	keys := []string{"{" + g + "}:a", "{" + g + "}:b"}
	fences := []string{sharding.FenceKey(keys[0]), sharding.FenceKey(keys[1])}
	t.Cleanup(func() { c.Del(context.Background(), append(keys, fences...)...) })
	run := func(s *redis.Script, keys []string, args ...any) any {
		t.Helper()
		v, err := s.Run(ctx, c, keys, args...).Result()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	want := func(what string, got, want any) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: got %#v, want %v", what, got, want)
		}
	}
	// acquire_batch.lua: token, TTL, fencing, first try, mark.
	want("free batch", run(scripts.AcquireBatch, keys, "t1", 10000, "0", "1", "0"), int64(1))
	want("re-sent", run(scripts.AcquireBatch, keys, "t1", 10000, "0", "1", "0"), []any{int64(2)})
	want("held by another", run(scripts.AcquireBatch, keys, "t2", 10000, "0", "1", "0"), []any{int64(0), int64(1), int64(2)})
	// release_batch.lua: token.
	want("released", run(scripts.ReleaseBatch, keys, "t1"), int64(1))
	want("gone", run(scripts.ReleaseBatch, keys, "t1"), []any{int64(0), int64(0)})
	fenced := run(scripts.AcquireBatch, append(keys, fences...), "t3", 10000, "1", "1", "0")
	if v, ok := fenced.([]any); !ok || len(v) != 3 || v[0] != int64(1) {
		t.Errorf("fenced batch: got %#v, want {1, fence, fence}", fenced)
	}
	if err := c.Set(ctx, keys[1], "other", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	want("one key another's", run(scripts.ReleaseBatch, keys, "t3"), []any{int64(1), int64(-1)})

	// Through the Manager, both ways.
	m := newManager(t, c)
	res := group(t, testenv.Unique("replies-m"), "a", "b")
	l, err := m.TryAcquireBatch(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release of a batch nobody touched: %v", err)
	}
	l, err = m.TryAcquireBatch(ctx, res, manager.WithFencing(true))
	if err != nil || l.Fence() == 0 {
		t.Fatalf("fenced batch: %v, fence %d", err, l.Fence())
	}
	if err := c.Del(ctx, l.Keys()[1]).Err(); err != nil {
		t.Fatal(err)
	}
	var be *manager.BatchReleaseError
	if err := l.Release(ctx); !errors.As(err, &be) || len(be.Results) != 1 {
		t.Fatalf("Release with a key gone: %v, want a BatchReleaseError for that key", err)
	}
}
