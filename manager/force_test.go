package manager_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// An operator's ForceRelease removes a lock whoever holds it and hands it
// to the next waiter; the evicted holder learns who forced it and why at
// its next renewal, and its Release says so too.
func TestRealForceRelease(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := ctxT(t)
		log, logs := observedLogger()
		admin := newManager(t, c, manager.WithOwner("ops-alice"), manager.WithLogger(log))
		holder := newManager(t, c, manager.WithOwner("worker-1"), manager.WithTTL(900*time.Millisecond))
		waiter := newManager(t, c, manager.WithOwner("worker-2"))
		res := testenv.Unique("force")
		l, err := holder.TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan acquired, 1)
		go func() {
			wl, err := waiter.Acquire(ctx, res)
			got <- acquired{l: wl, err: err}
		}()
		eventually(t, 5*time.Second, "waiter queued", func() bool { return queueLen(t, c, l.Key()) == 1 })
		if err := admin.ForceRelease(ctx, res, "stuck since the deploy"); err != nil {
			t.Fatal(err)
		}
		w := <-got // handed over, as a release would
		if w.err != nil {
			t.Fatal(w.err)
		}
		// The evicted holder's next renewal finds the record.
		waitDone(t, l, 5*time.Second)
		var fe *manager.ForcedReleaseError
		if !errors.As(l.Err(), &fe) || fe.By != "ops-alice" || fe.Reason != "stuck since the deploy" ||
			!errors.Is(l.Err(), manager.ErrForceReleased) || !errors.Is(l.Err(), manager.ErrLockLost) {
			t.Fatalf("evicted holder's Err = %v", l.Err())
		}
		if err := l.Release(ctx); !errors.Is(err, manager.ErrForceReleased) {
			t.Fatalf("evicted holder's Release = %v", err)
		}
		if c.Get(ctx, l.Key()).Val() != w.l.Token()+"\x1e" && c.Get(ctx, l.Key()).Val() != w.l.Token() {
			t.Fatal("the key is not the waiter's")
		}
		entries := logs.FilterField(zap.String("event", "force_released")).All()
		if len(entries) != 1 {
			t.Fatalf("%d force_released log lines", len(entries))
		}
		for _, f := range entries[0].Context {
			if strings.Contains(f.String, l.Token()) {
				t.Fatalf("the log carries the token in %s", f.Key)
			}
		}
		if m := entries[0].ContextMap(); m["evicted_owner"] != "worker-1" || m["by"] != "ops-alice" {
			t.Fatalf("log fields %v", m)
		}

		// The new holder's release right after an eviction works as usual;
		// an evicted holder that releases before its renewal learns too.
		_ = w.l.Release(ctx)
		l2, err := holder.TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		if err := admin.ForceRelease(ctx, res, "again"); err != nil {
			t.Fatal(err)
		}
		if err := l2.Release(ctx); !errors.As(err, &fe) || fe.Reason != "again" {
			t.Fatalf("Release after a forced release = %v", err)
		}
	})
}

// ForceRelease of nothing, of a value shardlock did not write, or with a
// bad reason: a clear error, and nothing written.
func TestRealForceReleaseRefusals(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := ctxT(t)
		m := newManager(t, c)
		res := testenv.Unique("force-no")
		if err := m.ForceRelease(ctx, res, "why"); !errors.Is(err, manager.ErrExpired) {
			t.Fatalf("ForceRelease of nothing = %v", err)
		}
		key := "shardlock:{" + res + "}"
		_ = c.Set(ctx, key, "foobar", time.Minute).Err()
		defer c.Del(ctx, key)
		if err := m.ForceRelease(ctx, res, "why"); !errors.Is(err, manager.ErrNotHeld) {
			t.Fatalf("ForceRelease of a foreign value = %v", err)
		}
		if v := c.Get(ctx, key).Val(); v != "foobar" {
			t.Fatalf("the foreign value became %q", v)
		}
		var ia *manager.InvalidArgumentError
		for _, why := range []string{"", strings.Repeat("x", manager.MaxReasonLen+1), "bad\nreason"} {
			if err := m.ForceRelease(ctx, res, why); !errors.As(err, &ia) {
				t.Fatalf("ForceRelease with reason %q = %v", why, err)
			}
		}
	})
}
