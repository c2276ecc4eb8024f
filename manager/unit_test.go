package manager_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/shardlock/shardlock/manager"
)

func TestNewRejectsBadOptions(t *testing.T) {
	_, c := miniClient(t)
	var nilClient *redis.Client
	if _, err := manager.New(nil); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("New(nil) = %v", err)
	}
	if _, err := manager.New(nilClient); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("New(nil *redis.Client) = %v", err)
	}
	tests := []struct {
		name string
		give []manager.Option
	}{
		{"prefix with brace", []manager.Option{manager.WithKeyPrefix("lock{")}},
		{"ttl too short", []manager.Option{manager.WithTTL(time.Millisecond)}},
		{"ttl too long", []manager.Option{manager.WithTTL(25 * time.Hour)}},
		{"renew not below ttl", []manager.Option{manager.WithTTL(time.Second), manager.WithRenewInterval(time.Second)}},
		{"negative renew", []manager.Option{manager.WithRenewInterval(-1)}},
		{"empty owner", []manager.Option{manager.WithOwner("")}},
		{"owner with newline", []manager.Option{manager.WithOwner("a\nb")}},
		{"owner too long", []manager.Option{manager.WithOwner(strings.Repeat("o", manager.MaxOwnerLen+1))}},
		{"nil logger", []manager.Option{manager.WithLogger(nil)}},
		{"nil retry", []manager.Option{manager.WithRetry(nil)}},
		{"negative wait", []manager.Option{manager.WithWait(-time.Second)}},
		{"wait too long", []manager.Option{manager.WithWait(manager.MaxWait + 1)}},
		{"negative max hold", []manager.Option{manager.WithMaxHold(-time.Second)}},
		{"replica timeout zero", []manager.Option{manager.WithReplicaAck(1, 0, manager.ReplicaFail)}},
		{"replica timeout not below ttl", []manager.Option{manager.WithTTL(time.Second), manager.WithReplicaAck(1, time.Second, manager.ReplicaFail)}},
		{"negative replicas", []manager.Option{manager.WithReplicaAck(-1, time.Millisecond, manager.ReplicaFail)}},
		{"unknown replica policy", []manager.Option{manager.WithReplicaAck(1, time.Millisecond, manager.ReplicaPolicy(9))}},
		{"negative startup check", []manager.Option{manager.WithStartupCheck(-1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := manager.New(c, tt.give...)
			var iae *manager.InvalidArgumentError
			if !errors.As(err, &iae) || !errors.Is(err, manager.ErrInvalidArgument) || m != nil {
				t.Fatalf("New = %v, %v; want *InvalidArgumentError", m, err)
			}
		})
	}
}

// Bad input fails with a typed error before any command reaches Redis.
func TestBadInputMakesNoRoundTrip(t *testing.T) {
	_, c := miniClient(t)
	hook := &faultHook{}
	c.AddHook(hook)
	m := newManager(t, c, manager.WithCoalescing(false), manager.WithRenewInterval(time.Second))
	ctx := ctxT(t)
	held, err := m.TryAcquire(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	before := hook.seen.Load()
	tests := []struct {
		name string
		call func() error
	}{
		{"empty resource", func() error { _, err := m.TryAcquire(ctx, ""); return err }},
		{"resource too long", func() error {
			_, err := m.Acquire(ctx, strings.Repeat("r", manager.MaxResourceLen+1))
			return err
		}},
		{"resource with stray brace", func() error { _, err := m.TryAcquire(ctx, "a}b"); return err }},
		{"resource with reserved suffix", func() error { _, err := m.TryAcquire(ctx, "x:fence"); return err }},
		{"ttl too short", func() error {
			_, err := m.TryAcquire(ctx, "r", manager.WithTTL(time.Microsecond))
			return err
		}},
		{"ttl not above renew interval", func() error {
			_, err := m.Acquire(ctx, "r", manager.WithTTL(time.Second))
			return err
		}},
		{"negative wait", func() error { _, err := m.Acquire(ctx, "r", manager.WithWait(-1)); return err }},
		{"nil retry", func() error { _, err := m.Acquire(ctx, "r", manager.WithRetry(nil)); return err }},
		{"negative max hold", func() error {
			_, err := m.Acquire(ctx, "r", manager.WithMaxHold(-time.Second))
			return err
		}},
		{"nil context", func() error {
			//lint:ignore SA1012 testing the nil-context check
			_, err := m.TryAcquire(nil, "r") //nolint:staticcheck
			return err
		}},
		{"nil fn", func() error { return m.Do(ctx, "r", nil) }},
		{"extend ttl too long", func() error { return held.Extend(ctx, manager.MaxTTL+1) }},
		{"extend ttl not above renew interval", func() error { return held.Extend(ctx, time.Second) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			var iae *manager.InvalidArgumentError
			if !errors.As(err, &iae) {
				t.Fatalf("got %v, want *InvalidArgumentError", err)
			}
		})
	}
	if n := hook.seen.Load() - before; n != 0 {
		t.Fatalf("bad input sent %d commands to Redis", n)
	}
}

func TestNilLockIsSafe(t *testing.T) {
	var l *manager.Lock
	ctx := context.Background()
	if err := l.Release(ctx); !errors.Is(err, manager.ErrNilLock) {
		t.Fatalf("Release = %v", err)
	}
	if err := l.Extend(ctx, time.Second); !errors.Is(err, manager.ErrNilLock) {
		t.Fatalf("Extend = %v", err)
	}
	if _, err := l.TTL(ctx); !errors.Is(err, manager.ErrNilLock) {
		t.Fatalf("TTL = %v", err)
	}
	if l.Key() != "" || l.Token() != "" || l.Resource() != "" || l.Fence() != 0 || !l.AcquiredAt().IsZero() || l.Replicas() != 0 {
		t.Fatal("accessors of a nil lock return values")
	}
	<-l.Done()
	<-l.Context().Done()
	if !errors.Is(l.Err(), manager.ErrNilLock) {
		t.Fatalf("Err = %v", l.Err())
	}
}

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

func TestSecondReleaseMakesNoRoundTrip(t *testing.T) {
	_, c := miniClient(t)
	hook := &faultHook{}
	c.AddHook(hook)
	m := newManager(t, c, manager.WithCoalescing(false))
	ctx := ctxT(t)
	l, err := m.TryAcquire(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	before := hook.seen.Load()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if err := l.Release(ctx); err != nil {
				t.Errorf("Release again = %v", err)
			}
		})
	}
	wg.Wait()
	if n := hook.seen.Load() - before; n != 0 {
		t.Fatalf("repeated Release sent %d commands", n)
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

func TestWatchdogDetectsLoss(t *testing.T) {
	tests := []struct {
		name    string
		tamper  func(mr interface{ Del(string) bool }, set func(string, string) error, key string)
		wantErr error
	}{
		{"deleted", func(mr interface{ Del(string) bool }, _ func(string, string) error, key string) { mr.Del(key) }, manager.ErrExpired},
		{"overwritten", func(_ interface{ Del(string) bool }, set func(string, string) error, key string) {
			_ = set(key, "thief")
		}, manager.ErrNotHeld},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mr, c := miniClient(t)
			logger, logs := observedLogger()
			m := newManager(t, c, manager.WithLogger(logger), manager.WithTTL(3*time.Second),
				manager.WithRenewInterval(20*time.Millisecond))
			ctx := ctxT(t)
			l, err := m.TryAcquire(ctx, "r")
			if err != nil {
				t.Fatal(err)
			}
			tt.tamper(mr, mr.Set, l.Key())
			waitDone(t, l, 2*time.Second)
			if !errors.Is(l.Err(), manager.ErrLockLost) || !errors.Is(l.Err(), tt.wantErr) {
				t.Fatalf("Err = %v, want ErrLockLost and %v", l.Err(), tt.wantErr)
			}
			if cause := context.Cause(l.Context()); !errors.Is(cause, manager.ErrLockLost) {
				t.Fatalf("Context cause = %v", cause)
			}
			if err := l.Release(ctx); !errors.Is(err, manager.ErrLockLost) {
				t.Fatalf("Release of a lost lock = %v", err)
			}
			lost := logs.FilterMessage("lock lost")
			if lost.Len() != 1 || lost.All()[0].Level != zap.ErrorLevel {
				t.Fatalf("want one ERROR line for the loss, got %v", lost.All())
			}
			for _, e := range logs.All() {
				for k, v := range e.ContextMap() {
					if s, ok := v.(string); ok && strings.Contains(s, l.Token()) {
						t.Fatalf("log %q field %s holds the full token", e.Message, k)
					}
				}
			}
		})
	}
}

// Without the watchdog, a lock is lost when its TTL runs out by the local
// clock: Done closes and Context is cancelled.
func TestNoWatchdogLockEndsAtTTL(t *testing.T) {
	_, c := miniClient(t)
	m := newManager(t, c, manager.WithWatchdog(false))
	l, err := m.TryAcquire(ctxT(t), "r", manager.WithTTL(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, 2*time.Second)
	if !errors.Is(l.Err(), manager.ErrLockLost) {
		t.Fatalf("Err = %v", l.Err())
	}
}

func TestMaxHold(t *testing.T) {
	_, c := miniClient(t)
	m := newManager(t, c, manager.WithTTL(300*time.Millisecond), manager.WithMaxHold(100*time.Millisecond))
	l, err := m.TryAcquire(ctxT(t), "r")
	if err != nil {
		t.Fatal(err)
	}
	<-l.Context().Done()
	if cause := context.Cause(l.Context()); !errors.Is(cause, manager.ErrMaxHoldExceeded) {
		t.Fatalf("Context cause = %v", cause)
	}
	waitDone(t, l, 2*time.Second)
	if !errors.Is(l.Err(), manager.ErrLockLost) || !errors.Is(l.Err(), manager.ErrMaxHoldExceeded) {
		t.Fatalf("Err = %v", l.Err())
	}
	if time.Since(l.AcquiredAt()) < 100*time.Millisecond {
		t.Fatal("lock ended before its max hold")
	}
}

func TestExtendAndTTL(t *testing.T) {
	mr, c := miniClient(t)
	m := newManager(t, c, manager.WithWatchdog(false))
	ctx := ctxT(t)
	l, err := m.TryAcquire(ctx, "r", manager.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if d, err := l.TTL(ctx); err != nil || d <= 50*time.Second {
		t.Fatalf("TTL after Extend(1m) = %v, %v", d, err)
	}
	mr.Del(l.Key())
	if err := l.Extend(ctx, time.Minute); !errors.Is(err, manager.ErrExpired) {
		t.Fatalf("Extend of a deleted key = %v", err)
	}
	if mr.Exists(l.Key()) {
		t.Fatal("Extend re-created the key")
	}
	waitDone(t, l, time.Second)
	if _, err := l.TTL(ctx); !errors.Is(err, manager.ErrLockLost) {
		t.Fatalf("TTL of a lost lock = %v", err)
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

func TestCloseReleasesHeldLocks(t *testing.T) {
	mr, c := miniClient(t)
	m, err := manager.New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	var locks []*manager.Lock
	for _, r := range []string{"a", "b", "c"} {
		l, err := m.TryAcquire(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, l)
	}
	if err := locks[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(ctx); err != nil {
		t.Fatalf("Close = %v", err)
	}
	for _, l := range locks {
		waitDone(t, l, time.Second)
		if l.Err() != nil || mr.Exists(l.Key()) {
			t.Fatalf("lock %s after Close: err %v, key exists %v", l.Resource(), l.Err(), mr.Exists(l.Key()))
		}
	}
	if _, err := m.TryAcquire(ctx, "a"); !errors.Is(err, manager.ErrClosed) {
		t.Fatalf("TryAcquire after Close = %v", err)
	}
	if err := m.Close(ctx); !errors.Is(err, manager.ErrClosed) {
		t.Fatalf("second Close = %v", err)
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
		if !mr.Exists("shardlock:{r}") {
			t.Fatal("injected fault did not run the command")
		}
		eventually(t, 2*time.Second, "orphaned key released", func() bool { return !mr.Exists("shardlock:{r}") })
	}
}

func TestReleaseRetriesTransientErrors(t *testing.T) {
	for _, lostReply := range []bool{false, true} {
		mr, c := miniClient(t)
		hook := &faultHook{cmd: "evalsha", lostReply: lostReply}
		c.AddHook(hook)
		m := newManager(t, c, manager.WithCoalescing(false), manager.WithWatchdog(false))
		ctx := ctxT(t)
		l, err := m.TryAcquire(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		hook.n.Store(2)
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release through 2 transient errors (lost reply %v) = %v", lostReply, err)
		}
		if mr.Exists(l.Key()) {
			t.Fatal("key still held")
		}
	}
}

func TestTraceIDAndFieldsInLogs(t *testing.T) {
	_, c := miniClient(t)
	logger, logs := observedLogger()
	type key struct{}
	m := newManager(t, c, manager.WithLogger(logger), manager.WithOwner("svc-1"),
		manager.WithTraceID(func(ctx context.Context) string { s, _ := ctx.Value(key{}).(string); return s }))
	ctx := context.WithValue(ctxT(t), key{}, "trace-42")
	l, err := m.TryAcquire(ctx, "r", manager.WithFencing(true))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, msg := range []string{"lock acquired", "lock released"} {
		es := logs.FilterMessage(msg).All()
		if len(es) != 1 {
			t.Fatalf("%q logged %d times", msg, len(es))
		}
		f := es[0].ContextMap()
		if f["trace_id"] != "trace-42" || f["resource"] != "r" || f["owner"] != "svc-1" || f["fence"] != l.Fence() || l.Fence() == 0 {
			t.Fatalf("%q fields: %v", msg, f)
		}
		if tok, _ := f["token"].(string); tok == l.Token() || !strings.Contains(tok, "…") {
			t.Fatalf("%q logs token %q", msg, tok)
		}
	}
}

func TestStartupCheckSkipsEmulatorVersion(t *testing.T) {
	_, c := miniClient(t)
	// miniredis does not report a server version; New must still work.
	m, err := manager.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// Renewals that fail for a transient reason are retried while the lock is
// valid: a few failures lose nothing, failures past the validity lose it.
func TestWatchdogRetriesTransientRenewalFailures(t *testing.T) {
	t.Run("recovers", func(t *testing.T) {
		_, c := miniClient(t)
		hook := &faultHook{cmd: "evalsha"}
		c.AddHook(hook)
		m := newManager(t, c, manager.WithCoalescing(false), manager.WithTTL(time.Second),
			manager.WithRenewInterval(50*time.Millisecond))
		l, err := m.TryAcquire(ctxT(t), "r")
		if err != nil {
			t.Fatal(err)
		}
		hook.n.Store(3)
		eventually(t, 5*time.Second, "three failed renewals", func() bool { return hook.n.Load() < 0 })
		// Then a successful renewal: the key's TTL is set again.
		before := hook.seen.Load()
		eventually(t, 5*time.Second, "a renewal after the failures", func() bool { return hook.seen.Load() > before })
		select {
		case <-l.Done():
			t.Fatalf("lost after transient failures: %v", l.Err())
		default:
		}
		if err := l.Release(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("expires", func(t *testing.T) {
		_, c := miniClient(t)
		hook := &faultHook{cmd: "evalsha"}
		c.AddHook(hook)
		m := newManager(t, c, manager.WithCoalescing(false), manager.WithTTL(200*time.Millisecond))
		l, err := m.TryAcquire(ctxT(t), "r")
		if err != nil {
			t.Fatal(err)
		}
		hook.n.Store(1 << 30)
		waitDone(t, l, 5*time.Second)
		// A validity that ran out is an expiry, as far as this process
		// knows, and says so.
		if !errors.Is(l.Err(), manager.ErrLockLost) || !errors.Is(l.Err(), manager.ErrExpired) || errors.Is(l.Err(), manager.ErrNotHeld) ||
			!strings.Contains(l.Err().Error(), "validity ran out") {
			t.Fatalf("Err = %v, want a loss by validity", l.Err())
		}
		if since := time.Since(l.AcquiredAt()); since < 150*time.Millisecond {
			t.Fatalf("declared lost after %v, before its validity ran out", since)
		}
	})
}

// New refuses a server older than Redis 7.0.
func TestNewRejectsOldServer(t *testing.T) {
	_, c := miniClient(t)
	c.AddHook(infoHook{version: "6.2.14"})
	_, err := manager.New(c)
	var sve *manager.ServerVersionError
	if !errors.As(err, &sve) || !errors.Is(err, manager.ErrUnsupportedServer) || sve.Version != "6.2.14" {
		t.Fatalf("New on Redis 6.2 = %v", err)
	}
	_, c2 := miniClient(t)
	c2.AddHook(infoHook{version: "7.0.15"})
	m, err := manager.New(c2)
	if err != nil {
		t.Fatalf("New on Redis 7.0.15 = %v", err)
	}
	_ = m.Close(ctxT(t))
}

// infoHook answers INFO as a server of the given version would.
type infoHook struct{ version string }

func (h infoHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h infoHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if sc, ok := cmd.(*redis.StringCmd); ok && cmd.Name() == "info" {
			sc.SetVal("# Server\r\nredis_version:" + h.version + "\r\nredis_mode:standalone\r\n")
			return nil
		}
		return next(ctx, cmd)
	}
}
func (h infoHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
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

// Every "no longer held" error is one family: errors.Is(err, ErrLockLost)
// matches each, and each keeps its own reason.
func TestLostErrorFamily(t *testing.T) {
	for _, err := range []error{manager.ErrNotHeld, manager.ErrExpired, fmt.Errorf("release: %w", manager.ErrNotHeld)} {
		if !errors.Is(err, manager.ErrLockLost) {
			t.Errorf("%v does not match ErrLockLost", err)
		}
	}
	if errors.Is(manager.ErrNotHeld, manager.ErrExpired) || errors.Is(manager.ErrExpired, manager.ErrNotHeld) {
		t.Error("ErrNotHeld and ErrExpired match each other")
	}
	for _, err := range []error{manager.ErrNotAcquired, manager.ErrReleased, manager.ErrClosed, manager.ErrMaxHoldExceeded} {
		if errors.Is(err, manager.ErrLockLost) {
			t.Errorf("%v matches ErrLockLost", err)
		}
	}
	// A release that finds the key someone else's says so, in the family.
	_, c := miniClient(t)
	m := newManager(t, c)
	ctx := ctxT(t)
	l, err := m.TryAcquire(ctx, "family")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, l.Key(), "someone-else", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, manager.ErrNotHeld) || !errors.Is(err, manager.ErrLockLost) {
		t.Fatalf("Release = %v", err)
	}
}

// A Setting given to an acquire call overrides the manager's default for
// that call only: fencing can be turned off for one lock.
func TestSettingPerCall(t *testing.T) {
	_, c := miniClient(t)
	m := newManager(t, c, manager.WithFencing(true), manager.WithTTL(5*time.Second))
	ctx := ctxT(t)
	plain, err := m.TryAcquire(ctx, "setting-a", manager.WithFencing(false), manager.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	fenced, err := m.TryAcquire(ctx, "setting-b")
	if err != nil {
		t.Fatal(err)
	}
	if plain.Fence() != 0 || fenced.Fence() == 0 {
		t.Fatalf("fences %d (fencing off for the call) and %d (the default)", plain.Fence(), fenced.Fence())
	}
	if ttl, _ := plain.TTL(ctx); ttl > 2*time.Second {
		t.Fatalf("per-call TTL not applied: %v", ttl)
	}
	if ttl, _ := fenced.TTL(ctx); ttl <= 2*time.Second {
		t.Fatalf("the manager's TTL not applied: %v", ttl)
	}
}
