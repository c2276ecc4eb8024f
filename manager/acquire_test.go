package manager_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/manager"
)

func TestTryAcquireAndReleaseResults(t *testing.T) {
	for _, ap := range []bool{true, false} {
		t.Run(map[bool]string{true: "autopipeline", false: "plain"}[ap], func(t *testing.T) {
			mr, c := miniClient(t)
			m := newManager(t, c, manager.WithCoalescing(ap))
			ctx := ctxT(t)

			l, err := m.TryAcquire(ctx, "order:1")
			if err != nil {
				t.Fatal(err)
			}
			if l.Key() != "shardlock:{order:1}" || l.Resource() != "order:1" {
				t.Fatalf("key %q resource %q", l.Key(), l.Resource())
			}
			if got, _ := mr.Get(l.Key()); got != l.Token() {
				t.Fatalf("stored %q, token %q", got, l.Token())
			}
			if _, err := m.TryAcquire(ctx, "order:1"); !errors.Is(err, manager.ErrNotAcquired) {
				t.Fatalf("contended TryAcquire = %v", err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatalf("Release = %v", err)
			}
			waitDone(t, l, time.Second)
			if l.Err() != nil || !errors.Is(context.Cause(l.Context()), manager.ErrReleased) {
				t.Fatalf("after release Err=%v cause=%v", l.Err(), context.Cause(l.Context()))
			}
			if mr.Exists(l.Key()) {
				t.Fatal("key still there after Release")
			}

			// Someone else holds the key now.
			l2, err := m.TryAcquire(ctx, "order:1", manager.WithWatchdog(false))
			if err != nil {
				t.Fatal(err)
			}
			mr.Set(l2.Key(), "someone-else")
			if err := l2.Release(ctx); !errors.Is(err, manager.ErrNotHeld) {
				t.Fatalf("Release of an overwritten key = %v", err)
			}
			if got, _ := mr.Get(l2.Key()); got != "someone-else" {
				t.Fatal("Release deleted another owner's key")
			}
			if err := l2.Release(ctx); !errors.Is(err, manager.ErrNotHeld) {
				t.Fatalf("second Release = %v, want the first result", err)
			}
			mr.Del(l2.Key())

			// The key expired.
			l3, err := m.TryAcquire(ctx, "order:1", manager.WithWatchdog(false))
			if err != nil {
				t.Fatal(err)
			}
			mr.FastForward(manager.DefaultTTL + time.Second)
			if err := l3.Release(ctx); !errors.Is(err, manager.ErrExpired) {
				t.Fatalf("Release of an expired key = %v", err)
			}
			if !errors.Is(l3.Err(), manager.ErrLockLost) {
				t.Fatalf("Err after releasing an expired key = %v", l3.Err())
			}
		})
	}
}

func TestAcquireWaitsForRelease(t *testing.T) {
	_, c := miniClient(t)
	m := newManager(t, c, manager.WithRetry(manager.LinearBackoff(5*time.Millisecond)))
	ctx := ctxT(t)
	l, err := m.TryAcquire(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l2, err := m.Acquire(ctx, "r")
		if err == nil {
			err = l2.Release(ctx)
		}
		got <- err
	}()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
}

func TestAcquireEndsWithContextOrWaitLimit(t *testing.T) {
	_, c := miniClient(t)
	m := newManager(t, c, manager.WithRetry(manager.LinearBackoff(5*time.Millisecond)))
	ctx := ctxT(t)
	if _, err := m.TryAcquire(ctx, "r"); err != nil {
		t.Fatal(err)
	}

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := m.Acquire(short, "r")
	if !errors.Is(err, manager.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its context = %v, want ErrNotAcquired and DeadlineExceeded", err)
	}

	canceled, cancel2 := context.WithCancel(ctx)
	cancel2()
	_, err = m.Acquire(canceled, "r")
	if !errors.Is(err, manager.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled context = %v", err)
	}

	_, err = m.Acquire(ctx, "r", manager.WithWait(30*time.Millisecond))
	if !errors.Is(err, manager.ErrNotAcquired) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its wait limit = %v, want ErrNotAcquired only", err)
	}

	_, err = m.Acquire(ctx, "r", manager.WithRetry(manager.LimitRetry(manager.LinearBackoff(time.Millisecond), 3)))
	if !errors.Is(err, manager.ErrNotAcquired) {
		t.Fatalf("Acquire past its attempts = %v", err)
	}
}

func TestFencingIncreases(t *testing.T) {
	_, c := miniClient(t)
	m := newManager(t, c, manager.WithFencing(true))
	ctx := ctxT(t)
	assertFencesRise(t, m, "r", 20)
	off := newManager(t, c)
	l, err := off.TryAcquire(ctx, "r2")
	if err != nil || l.Fence() != 0 {
		t.Fatalf("fence without fencing = %d, %v", l.Fence(), err)
	}
}

func TestDo(t *testing.T) {
	mr, c := miniClient(t)
	m := newManager(t, c, manager.WithTTL(3*time.Second), manager.WithRenewInterval(20*time.Millisecond))
	ctx := ctxT(t)

	want := errors.New("work failed")
	var key string
	err := m.Do(ctx, "r", func(ctx context.Context) error {
		key = "shardlock:{r}"
		if !mr.Exists(key) {
			t.Error("fn runs without the lock")
		}
		return want
	})
	if !errors.Is(err, want) || errors.Is(err, manager.ErrLockLost) {
		t.Fatalf("Do = %v", err)
	}
	if mr.Exists(key) {
		t.Fatal("Do left the lock held")
	}

	err = m.Do(ctx, "r", func(ctx context.Context) error {
		mr.Del(key) // lost behind our back
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), manager.ErrLockLost) {
			t.Errorf("fn context cause = %v", context.Cause(ctx))
		}
		return ctx.Err()
	})
	if !errors.Is(err, manager.ErrLockLost) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Do with a lost lock = %v", err)
	}
}

// A re-sent acquire whose first try ran but whose reply was lost finds its
// own token and holds the lock.
func TestAcquireAfterLostReplyIsIdempotent(t *testing.T) {
	mr, c := miniClient(t)
	hook := &faultHook{cmd: "set", lostReply: true}
	hook.n.Store(1)
	c.AddHook(hook)
	m := newManager(t, c, manager.WithCoalescing(false), manager.WithRetry(manager.LinearBackoff(time.Millisecond)))
	l, err := m.Acquire(ctxT(t), "r")
	if err != nil {
		t.Fatalf("Acquire = %v", err)
	}
	if got, _ := mr.Get(l.Key()); got != l.Token() {
		t.Fatal("lock not held after a lost reply")
	}
}

// resendHook runs the first SET (or the first command called name) twice
// and answers with the second reply, as go-redis does when it re-sends a
// command whose reply was lost.
type resendHook struct {
	name string
	n    atomic.Int64
}

func (h *resendHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *resendHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := h.name
		if name == "" {
			name = "set"
		}
		if cmd.Name() == name && h.n.Add(1) == 1 {
			_ = next(ctx, cmd)
		}
		return next(ctx, cmd)
	}
}

func (h *resendHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A one-shot acquire whose SET was re-sent (the first run took the key, the
// second answered nil) finds its own token and holds the lock.
func TestTryAcquireAfterHiddenResend(t *testing.T) {
	mr, c := miniClient(t)
	hook := &resendHook{}
	c.AddHook(hook)
	m := newManager(t, c, manager.WithCoalescing(false))
	l, err := m.TryAcquire(ctxT(t), "r")
	if err != nil {
		t.Fatalf("TryAcquire after a re-sent SET = %v", err)
	}
	if hook.n.Load() != 1 {
		t.Fatalf("%d SETs", hook.n.Load())
	}
	if got, _ := mr.Get(l.Key()); got != l.Token() {
		t.Fatal("lock not held")
	}
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// A waiting acquire goes on to the queue script, which finds the token.
	hook.n.Store(0)
	l, err = m.Acquire(ctxT(t), "r", manager.WithWait(time.Second))
	if err != nil {
		t.Fatalf("Acquire after a re-sent SET = %v", err)
	}
	if got, _ := mr.Get(l.Key()); got != l.Token() {
		t.Fatal("lock not held")
	}
}

// A one-shot acquire whose reply was lost leaves no lock behind: its token
// is released in the background.
func TestLostAcquireReplyDoesNotStrandKey(t *testing.T) {
	for _, fenced := range []bool{false, true} {
		mr, c := miniClient(t)
		hook := &faultHook{cmd: "set", lostReply: true}
		if fenced {
			hook.cmd = "evalsha"
		}
		hook.n.Store(1)
		c.AddHook(hook)
		m := newManager(t, c, manager.WithCoalescing(false), manager.WithFencing(fenced))
		_, err := m.TryAcquire(ctxT(t), "r")
		if err == nil || errors.Is(err, manager.ErrNotAcquired) {
			t.Fatalf("TryAcquire with a lost reply = %v, want the timeout", err)
		}
		// The key itself may be released already: the reaper runs in the
		// background from the moment the attempt gives up.
		if !hook.ranOK.Load() {
			t.Fatal("injected fault did not run the command")
		}
		eventually(t, 2*time.Second, "orphaned key released", func() bool { return !mr.Exists("shardlock:{r}") })
	}
}

// Whatever the resource name, acquire neither panics nor leaves a lock:
// it is taken and released, or refused before any round trip.
func FuzzAcquireResource(f *testing.F) {
	for _, s := range []string{"order:1", "", "{a}", "a}b", "{}", "x:fence", "\x00", "中文", "{{a}}b"} {
		f.Add(s)
	}
	mr, c := miniClient(f)
	m := newManager(f, c, manager.WithWatchdog(false))
	f.Fuzz(func(t *testing.T, resource string) {
		ctx := context.Background()
		l, err := m.TryAcquire(ctx, resource)
		if err != nil {
			if !errors.Is(err, manager.ErrInvalidArgument) {
				t.Fatalf("TryAcquire(%q) = %v", resource, err)
			}
			return
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release(%q) = %v", resource, err)
		}
		if mr.Exists(l.Key()) {
			t.Fatalf("key of %q left behind", resource)
		}
	})
}

// lateHook makes the reply of the first n SETs arrive late: it runs the
// command, then sleeps, then runs expire (standing in for the server
// expiring the key meanwhile) with the token the SET wrote.
type lateHook struct {
	delay  time.Duration
	n      atomic.Int64
	expire func(key, token string)
}

func (h *lateHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *lateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "set" && h.n.Add(-1) >= 0 {
			time.Sleep(h.delay)
			h.expire(cmd.Args()[1].(string), cmd.Args()[2].(string))
		}
		return err
	}
}

func (h *lateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A reply that arrives after the lock's TTL does not count as acquired, and
// a retry takes the lock with a token of its own.
func TestLateReplyIsNotAcquired(t *testing.T) {
	mr, c := miniClient(t)
	var lateTokens []string
	hook := &lateHook{delay: 60 * time.Millisecond, expire: func(key, token string) {
		lateTokens = append(lateTokens, token)
		mr.Del(key)
	}}
	c.AddHook(hook)
	m := newManager(t, c, manager.WithCoalescing(false), manager.WithWatchdog(false),
		manager.WithRetry(manager.LinearBackoff(time.Millisecond)))
	ctx := ctxT(t)
	ttl := manager.WithTTL(50 * time.Millisecond)

	hook.n.Store(1)
	if _, err := m.TryAcquire(ctx, "r", ttl); !errors.Is(err, manager.ErrNotAcquired) {
		t.Fatalf("TryAcquire with a late reply = %v", err)
	}

	hook.n.Store(1)
	l, err := m.Acquire(ctx, "r", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if len(lateTokens) != 2 || l.Token() == lateTokens[1] {
		t.Fatalf("the retry reused the late attempt's token (late %d)", len(lateTokens))
	}
	if got, _ := mr.Get(l.Key()); got != l.Token() {
		t.Fatalf("stored %q, lock token %q", got, l.Token())
	}
}
