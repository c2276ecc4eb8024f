package manager_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/shardlock/shardlock/manager"
)

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
