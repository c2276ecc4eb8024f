package manager_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shardlock/shardlock/manager"
)

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

func TestCloseReleasesHeldLocks(t *testing.T) {
	mr, c := miniClient(t)
	m, err := manager.New(context.Background(), c)
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
