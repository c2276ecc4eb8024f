package manager

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
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
		{old: tok + QueuedMark, want: attemptReplay},
		{old: tok + "x", want: attemptContended},
		{old: tok[:len(tok)-1] + QueuedMark, want: attemptContended},
		{old: "other" + QueuedMark, want: attemptContended},
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
	w := newFairWaiter("sl1.1.abc.owner:with:colons", ac, time.UnixMilli(1700000000123))
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
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	m, err := New(c, WithStartupCheck(0))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	ctx := context.Background()
	holder, err := m.TryAcquire(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	q, err := m.queues.join(holder.key)
	if err != nil {
		t.Fatal(err)
	}
	defer m.queues.leave(holder.key, q)
	ac := m.defaultAC
	w := newFairWaiter(newToken("w", time.Now()), &ac, time.Now().Add(time.Minute))
	m.queues.setHead(q, w)
	h := m.queues.nextForRelease(holder) // the release picks w
	if h.w != w {
		t.Fatal("the release did not pick the waiter")
	}
	// The release ran on the server: the key is w's. w's re-check saw its
	// token and took the lock before the release's reply came.
	mr.Set(holder.key, w.token+QueuedMark)
	wl := m.newLock("r", holder.key, w.token, w.token, 0, time.Now(), time.Now(), &ac)
	m.queues.acquired(q, w, wl)
	// No reaper runs: a reaped token would be released at once, here.
	m.sched.stop()
	m.afterRelease(holder, h, 3, 0, time.Now(), false)
	if got, _ := mr.Get(holder.key); got != w.token+QueuedMark {
		t.Fatalf("the waiter's lock was released behind its back: key holds %q", got)
	}
}
