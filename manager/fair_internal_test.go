package manager

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
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
	w := newFairWaiter("sl1.1.abc.owner:with:colons", ac, time.UnixMilli(1700000000123), rwNone)
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
	wl := m.newLock("r", holder.key, w.token, w.token, 0, time.Now(), time.Now(), &ac)
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
	status, _, err := m.attemptQueued(ctx, holder.key, w, &ac)
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
	w := newFairWaiter(newToken("w", time.Now()), &ac, time.Now().Add(time.Minute), rwNone)
	m.queues.setHead(q, w)
	return mr, m, holder, q, w
}
