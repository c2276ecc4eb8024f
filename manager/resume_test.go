package manager_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// extendCounter counts the extend scripts (the watchdog's renewals) a
// client sends.
func extendCounter() *matchHook {
	return &matchHook{match: func(cmd redis.Cmder) bool {
		a := cmd.Args()
		return (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(a) > 1 &&
			a[1] == scripts.Extend.Hash()
	}}
}

// A lock handed on: the second manager resumes it by its token and its
// watchdog keeps it past its TTL; the first, told to Forget it, neither
// renews nor releases it (not even at Close). Then the second releases it.
func TestRealResumeAndForget(t *testing.T) {
	for _, target := range testenv.CuttableTargets() {
		t.Run(target.Name, func(t *testing.T) {
			ctx := ctxT(t)
			const ttl = 600 * time.Millisecond
			firstHook, secondHook := extendCounter(), extendCounter()
			firstClient, secondClient := target.Client(t, &testenv.Cutter{}), target.Client(t, &testenv.Cutter{})
			addHook(firstClient, firstHook)
			addHook(secondClient, secondHook)
			first := newManager(t, firstClient, manager.WithOwner("first"), manager.WithTTL(ttl), manager.WithFencing(true))
			second := newManager(t, secondClient, manager.WithOwner("second"), manager.WithTTL(ttl), manager.WithFencing(true))
			res := testenv.Unique("resume")
			l1, err := first.TryAcquire(ctx, res)
			if err != nil {
				t.Fatal(err)
			}
			l2, err := second.Resume(ctx, res, l1.Token())
			if err != nil {
				t.Fatal(err)
			}
			if l2.Token() != l1.Token() || l2.Fence() != l1.Fence() || !l2.AcquiredAt().Equal(l1.AcquiredAt().Truncate(time.Millisecond)) {
				t.Fatalf("resumed lock: token same %v, fence %d (was %d), acquired %v (was %v)",
					l2.Token() == l1.Token(), l2.Fence(), l1.Fence(), l2.AcquiredAt(), l1.AcquiredAt())
			}
			if err := l1.Forget(); err != nil {
				t.Fatal(err)
			}
			<-l1.Done()
			renewedByFirst := firstHook.n.Load()
			// The second manager's watchdog renews it (every TTL/3) past two
			// TTLs.
			eventually(t, 10*time.Second, "renewals by the second manager", func() bool { return secondHook.n.Load() >= 7 })
			if v := secondClient.Get(ctx, l1.Key()).Val(); v != l1.Token() {
				t.Fatalf("two TTLs on, the key holds %q", v)
			}
			if n := firstHook.n.Load(); n != renewedByFirst {
				t.Fatalf("the first manager renewed a forgotten lock %d times", n-renewedByFirst)
			}
			if err := l1.Release(ctx); !errors.Is(err, manager.ErrForgotten) {
				t.Fatalf("Release of a forgotten lock = %v", err)
			}
			if err := l1.Extend(ctx, time.Second); !errors.Is(err, manager.ErrForgotten) {
				t.Fatalf("Extend of a forgotten lock = %v", err)
			}
			if err := first.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if v := firstClient.Get(ctx, l1.Key()).Val(); v != l1.Token() {
				t.Fatalf("after the first manager's Close the key holds %q", v)
			}
			if ttl, err := l2.TTL(ctx); err != nil || ttl <= 0 {
				t.Fatalf("resumed lock's TTL: %v, %v", ttl, err)
			}
			if err := l2.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if n, _ := secondClient.Exists(ctx, l1.Key()).Result(); n != 0 {
				t.Fatal("the resumed lock's release left the key")
			}
		})
	}
}

// Resume reports why it cannot take a lock over: another token holds the
// key, none does, or the token is not one.
func TestRealResumeErrors(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := ctxT(t)
		m := newManager(t, c)
		res := testenv.Unique("resume-err")
		l, err := m.TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		other, _ := m.TryAcquire(ctx, res+"-other")
		if _, err := m.Resume(ctx, res, other.Token()); !errors.Is(err, manager.ErrNotHeld) {
			t.Fatalf("Resume with another lock's token = %v", err)
		}
		if _, err := m.Resume(ctx, res+"-none", l.Token()); !errors.Is(err, manager.ErrExpired) {
			t.Fatalf("Resume of a free resource = %v", err)
		}
		var ia *manager.InvalidArgumentError
		if _, err := m.Resume(ctx, res, "not-a-token"); !errors.As(err, &ia) {
			t.Fatalf("Resume with a bad token = %v", err)
		}
		if err := l.Forget(); err != nil {
			t.Fatal(err)
		}
		if err := l.Forget(); !errors.Is(err, manager.ErrForgotten) {
			t.Fatalf("second Forget = %v", err)
		}
		// Still held: another manager can resume it.
		if r, err := newManager(t, c).Resume(ctx, res, l.Token()); err != nil {
			t.Fatalf("Resume after Forget: %v", err)
		} else {
			_ = r.Release(ctx)
		}
		_ = other.Release(ctx)
	})
}
