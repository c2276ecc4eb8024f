package manager

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/sharding"
)

// A re-sent acquire finds its own token in the key, with or without the
// queued mark a waiter may have added meanwhile.
func TestParseSetNXGetReplayWithMark(t *testing.T) {
	tok := newToken("o", time.Now())
	for _, tt := range []struct {
		old  string
		nil  bool
		want int
	}{
		{nil: true, want: attemptFresh},
		{old: tok, want: attemptReplay},
		{old: tok + sharding.QueuedMark, want: attemptReplay},
		{old: tok + "x", want: attemptContended},
		{old: tok[:len(tok)-1] + sharding.QueuedMark, want: attemptContended},
		{old: "other" + sharding.QueuedMark, want: attemptContended},
	} {
		cmd := redis.NewStringCmd(context.Background())
		if tt.nil {
			cmd.SetErr(redis.Nil)
		} else {
			cmd.SetVal(tt.old)
		}
		got, err := parseSetNXGet(cmd, tok)
		if err != nil || got != tt.want {
			t.Errorf("old %q: %d, %v; want %d", tt.old, got, err, tt.want)
		}
	}
}

func TestQueueEntry(t *testing.T) {
	ac := &acquireConfig{ttl: 1500 * time.Millisecond, fencing: true}
	w := newFairWaiter("sl1.1.abc.owner:with:colons", ac, time.UnixMilli(1700000000123), kindExclusive.queueMark(ac.fencing))
	if got, want := w.makeEntry(), "1700000000123:1500:1:sl1.1.abc.owner:with:colons"; got != want {
		t.Fatalf("entry %q, want %q", got, want)
	}
}

// A release's local hand-over whose reply arrives after its waiter's own
// re-check found the lock handed to it (its token in the key) must leave
// the waiter's lock alone. It once sent the waiter's token to the reaper
// as if the waiter had given up, which freed a held lock and handed it to
// the next waiter: two holders (TestRealMutualExclusionStress found it).
func TestLateHandoverReplyKeepsWaitersLock(t *testing.T) {
	mr, m, holder, q, w := localWaiter(t)
	ac := m.defaultAC
	h := m.queues.nextForRelease(holder) // the release picks w
	if h.w != w {
		t.Fatal("the release did not pick the waiter")
	}
	// The release ran on the server: the key is w's. w's re-check saw its
	// token and took the lock before the release's reply came.
	mr.Set(holder.key, w.token+sharding.QueuedMark)
	wl := m.newLock(kindExclusive, "r", holder.key, w.token, w.token, 0, time.Now(), time.Now(), &ac)
	m.queues.acquired(q, w, wl)
	// No reaper runs: a reaped token would be released at once, here.
	m.sched.stop()
	m.afterRelease(holder, h, 3, 0, time.Now(), false)
	if got, _ := mr.Get(holder.key); got != w.token+sharding.QueuedMark {
		t.Fatalf("the waiter's lock was released behind its back: key holds %q", got)
	}
}

// While a release of this process's holder is handing the lock to the next
// local waiter, that waiter's own attempt must not queue it in Redis: the
// release grants it directly, and the entry left in the queue was later
// handed the lock again, after its waiter had released it, which stalled
// the lock for a whole TTL (the slot-migration fault run found it).
func TestLocalHandoverAndOwnAttemptQueueOnce(t *testing.T) {
	mr, m, holder, q, w := localWaiter(t)
	m.queues.acquired(q, nil, holder) // the holder was taken through the local queue
	ac := m.defaultAC
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	h := m.queues.nextForRelease(holder) // the holder's release picks w...
	if h.w != w {
		t.Fatal("the release did not pick the waiter")
	}
	// ... and w's own re-check runs before that release reaches Redis.
	status, _, err := m.attemptQueued(ctx, holder.key, w, &ac, false)
	if err != nil || status != attemptContended {
		t.Fatalf("attemptQueued = %d, %v", status, err)
	}
	if n, _ := c.LLen(ctx, sharding.QueueKey(holder.key)).Result(); n != 0 {
		t.Fatalf("the waiter queued itself while the release was handing it the lock (%d entries)", n)
	}
	res, err := scripts.Release.Run(ctx, c, []string{holder.key}, holder.token, h.entry, luaFlag(h.local)).Result()
	code, fence, err := parseRelease(res, err)
	if err != nil || code != 3 {
		t.Fatalf("release = %d, %v", code, err)
	}
	m.afterRelease(holder, h, code, fence, time.Now(), false)
	if g := <-w.ch; g.retry {
		t.Fatal("the waiter was told to retry, not handed the lock")
	}
	if n, _ := c.LLen(ctx, sharding.QueueKey(holder.key)).Result(); n != 0 {
		t.Fatalf("%d stale entries in the queue after the hand-over", n)
	}
	_ = c.Del(ctx, holder.key)
}

// localWaiter returns a manager on miniredis holding the lock on "r", with a
// local queue for it whose head is a fair waiter w; all closed at cleanup.
func localWaiter(t *testing.T) (*miniredis.Miniredis, *Manager, *Lock, *localQueue, *fairWaiter) {
	t.Helper()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	m, err := New(context.Background(), c, WithStartupCheck(false), WithCoalescing(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	holder, err := m.TryAcquire(context.Background(), "r")
	if err != nil {
		t.Fatal(err)
	}
	q, err := m.queues.join(holder.key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.queues.leave(holder.key, q) })
	ac := m.defaultAC
	w := newFairWaiter(newToken("w", time.Now()), &ac, time.Now().Add(time.Minute), kindExclusive.queueMark(ac.fencing))
	m.queues.setHead(q, w)
	return mr, m, holder, q, w
}

// countHook counts the commands a client sends while on is set.
type countHook struct {
	on *atomic.Bool
	n  *atomic.Int64
}

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.on.Load() {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.on.Load() {
			h.n.Add(int64(len(cmds)))
		}
		return next(ctx, cmds)
	}
}

// A lock released while this process's next waiter waits for that release
// is handed to it without a round trip: the waiter takes over the key's
// token. With fencing the release hands it over in Redis, with a new fence.
func TestRealLocalHandOverSendsNothing(t *testing.T) {
	for _, fencing := range []bool{false, true} {
		t.Run(fmt.Sprintf("fencing=%v", fencing), func(t *testing.T) {
			var on atomic.Bool
			var sent atomic.Int64
			c := redis.NewClient(&redis.Options{Addr: testenv.StandaloneAddr(t), ContextTimeoutEnabled: true})
			defer c.Close()
			c.AddHook(countHook{&on, &sent})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			m, err := New(ctx, c, WithFencing(fencing))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close(context.Background())
			res := testenv.Unique("transfer")
			h, err := m.TryAcquire(ctx, res)
			if err != nil {
				t.Fatal(err)
			}
			key := h.Key()
			start := func() <-chan *Lock {
				got := make(chan *Lock, 1)
				go func() {
					l, err := m.Acquire(ctx, res)
					if err != nil {
						t.Error(err)
					}
					got <- l
				}()
				return got
			}
			local := func(cond func(q *localQueue) bool) bool {
				m.queues.mu.Lock()
				defer m.queues.mu.Unlock()
				q := m.queues.queues[key]
				return q != nil && cond(q)
			}
			// a queues in Redis (the holder did not take the lock through
			// the local queue); b waits behind a in the process.
			gotA := start()
			eventuallyTrue(t, "a queued", func() bool { return c.LLen(ctx, sharding.QueueKey(key)).Val() == 1 })
			gotB := start()
			eventuallyTrue(t, "b waiting", func() bool { return local(func(q *localQueue) bool { return q.members == 2 }) })
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
			a := <-gotA
			if a == nil {
				t.FailNow()
			}
			eventuallyTrue(t, "b waits for a's release", func() bool {
				return local(func(q *localQueue) bool { return q.holder == a && q.head != nil && q.head.entry == "" })
			})
			on.Store(true)
			if err := a.Release(ctx); err != nil {
				t.Fatal(err)
			}
			b := <-gotB
			on.Store(false)
			if b == nil {
				t.FailNow()
			}
			switch {
			case !fencing && sent.Load() != 0:
				t.Errorf("the hand-over from a to b sent %d commands", sent.Load())
			case !fencing && b.Token() != a.Token():
				t.Error("b does not hold the key's token")
			case fencing && (sent.Load() == 0 || b.Fence() <= a.Fence()):
				t.Errorf("fenced: %d commands, fences %d then %d", sent.Load(), a.Fence(), b.Fence())
			}
			if v, _ := c.Get(ctx, key).Result(); !isOurs(v, b.Token()) {
				t.Errorf("the key holds %q, not b's token", v)
			}
			if err := b.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if n := c.Exists(ctx, key).Val(); n != 0 {
				t.Error("the key is left after b's release")
			}
		})
	}
}

// eventuallyTrue waits (5 s at most) until cond holds.
func eventuallyTrue(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// A lock handed over in the process to a waiter that gives up before it
// takes it up is released, not left held until its TTL.
func TestTransferToWaiterThatGivesUp(t *testing.T) {
	mr, m, holder, q, w := transferredToWaiter(t)
	if g := <-w.ch; g.transfer == nil || g.transfer.token != holder.token {
		t.Fatalf("grant %+v does not carry the holder's token", g)
	}
	_, transferred := m.queues.giveUp(q, w)
	if transferred == nil || transferred.token != holder.token {
		t.Fatal("giving up does not hand back the transferred lock")
	}
	if v, _ := mr.Get(holder.key); v != holder.token {
		t.Fatalf("the key holds %q, not the holder's token: the transfer wrote", v)
	}
}

// A token older than maxTransferAge is not handed over in the process: a
// holder's age, which the exporter reads from its token, stays within it
// of the truth.
func TestNoTransferOfOldToken(t *testing.T) {
	_, m, holder, q, w := localWaiter(t)
	m.queues.acquired(q, nil, holder)
	holder.token = newToken(m.cfg.owner, time.Now().Add(-maxTransferAge-time.Second))
	h := m.queues.nextForRelease(holder)
	if m.queues.transfer(holder, h) {
		t.Fatal("an old token was handed over in the process")
	}
	if ms, ok := tokenMillis(w.token); !ok || time.Since(time.UnixMilli(ms)) > time.Minute {
		t.Fatalf("tokenMillis(%q) = %d, %v", w.token, ms, ok)
	}
}

// A waiter handed a lock in the process makes no attempt of its own before
// it takes the lock up: the attempt would queue it in Redis under its own
// token, and a later release would hand the key to that entry, which
// nobody waits on (a claim lease lost).
func TestTransferredWaiterMakesNoAttempt(t *testing.T) {
	_, m, _, _, w := transferredToWaiter(t)
	if _, _, skip := m.queues.markQueued(w, time.Now()); !skip {
		t.Fatal("the waiter handed the lock would queue itself in Redis")
	}
}

// transferredToWaiter is localWaiter whose holder, taken through the local
// queue, has been released by handing it to w in the process (transfer).
func transferredToWaiter(t *testing.T) (*miniredis.Miniredis, *Manager, *Lock, *localQueue, *fairWaiter) {
	t.Helper()
	mr, m, holder, q, w := localWaiter(t)
	m.queues.acquired(q, nil, holder)
	h := m.queues.nextForRelease(holder)
	if !m.queues.transfer(holder, h) {
		t.Fatal("not transferred")
	}
	return mr, m, holder, q, w
}

// A lock handed over in the process on a claim lease is taken up however
// late its waiter gets to it: dropped, nothing would hand it over again.
func TestLateTransferOnClaimIsTakenUp(t *testing.T) {
	_, m, holder, q, w := localWaiter(t)
	holder.w.rn.claimed = true
	m.queues.acquired(q, nil, holder)
	h := m.queues.nextForRelease(holder)
	if !m.queues.transfer(holder, h) {
		t.Fatal("not transferred")
	}
	g := <-w.ch
	g.validFrom = g.validFrom.Add(-time.Second) // taken up a second late
	ac := m.defaultAC
	a := &acquirer{m: m, ctx: context.Background(), tg: target{kind: kindExclusive, resource: "r", key: holder.key}, ac: &ac, wait: true,
		fair: true, fw: w, queue: q, granted: &g, start: time.Now(), token: w.token, tokenArg: w.token,
		attemptDeadline: time.Now().Add(time.Second)}
	res, _, err := a.attemptN(2)
	if err != nil || res.status != attemptFresh || res.validUntil.IsZero() || a.token != holder.token {
		t.Fatalf("attemptN = %+v, %v, token taken over: %v", res, err, a.token == holder.token)
	}
}
