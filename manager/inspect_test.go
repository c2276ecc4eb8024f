package manager_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// Inspect tells who holds a lock, for how long, its fence and its queued
// waiters; a free resource, a foreign value and a key of another type are
// reported, not fatal; nothing is written.
func TestRealInspect(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := ctxT(t)
		holder := newManager(t, c, manager.WithOwner("holder:7"), manager.WithFencing(true))
		res := testenv.Unique("inspect")
		l, err := holder.TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			w := newManager(t, c, manager.WithOwner(fmt.Sprintf("waiter-%d", i)))
			go func() {
				if wl, err := w.Acquire(ctx, res, manager.WithWait(20*time.Second)); err == nil {
					_ = wl.Release(ctx)
				}
			}()
			eventually(t, 5*time.Second, "waiter queued", func() bool { return queueLen(t, c, l.Key()) == int64(i+1) })
		}
		before := c.Get(ctx, l.Key()).Val()
		info, err := holder.Inspect(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		if !info.Held || info.Foreign || info.Owner != "holder:7" || !info.AcquiredAt.Equal(l.AcquiredAt().Truncate(time.Millisecond)) ||
			info.TTL <= 0 || info.TTL > manager.DefaultTTL || info.Fence != l.Fence() || info.Waiters != 2 || info.OldestWait <= 0 || info.Key != l.Key() {
			t.Fatalf("Inspect = %+v (lock fence %d)", info, l.Fence())
		}
		if c.Get(ctx, l.Key()).Val() != before {
			t.Fatal("Inspect changed the key")
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}

		free, err := holder.Inspect(ctx, testenv.Unique("inspect-free"))
		if err != nil || free.Held || free.Waiters != 0 || free.Owner != "" {
			t.Fatalf("Inspect of a free resource = %+v, %v", free, err)
		}
		foreign := testenv.Unique("inspect-foreign")
		fk := "shardlock:{" + foreign + "}"
		_ = c.Set(ctx, fk, "foobar", time.Minute).Err()
		if fi, err := holder.Inspect(ctx, foreign); err != nil || !fi.Held || !fi.Foreign || fi.Owner != "" {
			t.Fatalf("Inspect of a foreign value = %+v, %v", fi, err)
		}
		_ = c.Del(ctx, fk).Err()
		_ = c.HSet(ctx, fk, "f", "v").Err()
		if fi, err := holder.Inspect(ctx, foreign); err != nil || !fi.Held || !fi.Foreign {
			t.Fatalf("Inspect of a hash = %+v, %v", fi, err)
		}
		if v := c.HGet(ctx, fk, "f").Val(); v != "v" {
			t.Fatal("Inspect changed a foreign key")
		}
		_ = c.Del(ctx, fk).Err()
		var ia *manager.InvalidArgumentError
		if _, err := holder.Inspect(ctx, ""); !errors.As(err, &ia) {
			t.Fatalf("Inspect(\"\") = %v", err)
		}
	})
}

// List walks every master and yields the locks a filter selects, as it
// goes; a caller that stops early stops the walk.
func TestRealList(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := ctxT(t)
		u := testenv.Unique("list")
		m := newManager(t, c, manager.WithOwner("lister"), manager.WithClassFunc(func(r string) string {
			if strings.HasPrefix(r, u+"-a") {
				return "alpha"
			}
			return "other"
		}))
		var held []*manager.Lock
		for i := range 12 {
			part := "b"
			if i < 8 {
				part = "a"
			}
			l, err := m.TryAcquire(ctx, fmt.Sprintf("%s-%s-%d", u, part, i))
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, l)
		}
		defer func() {
			for _, l := range held {
				_ = l.Release(ctx)
			}
		}()
		foreign := "shardlock:{" + u + "-a-foreign}"
		_ = c.Set(ctx, foreign, "foobar", time.Minute).Err()
		defer c.Del(ctx, foreign)

		count := func(opts manager.ListOptions) (locks, foreignSeen int) {
			for info, err := range m.List(ctx, opts) {
				if err != nil {
					t.Fatal(err)
				}
				if info.Foreign {
					foreignSeen++
					continue
				}
				if info.Owner != "lister" || !info.Held || info.TTL <= 0 {
					t.Fatalf("listed %+v", info)
				}
				locks++
			}
			return locks, foreignSeen
		}
		if n, f := count(manager.ListOptions{Prefix: u + "-", Count: 3}); n != 12 || f != 1 {
			t.Fatalf("prefix %q: %d locks, %d foreign; want 12 and 1", u, n, f)
		}
		if n, _ := count(manager.ListOptions{Prefix: u + "-b"}); n != 4 {
			t.Fatalf("prefix -b: %d locks, want 4", n)
		}
		if n, f := count(manager.ListOptions{Prefix: u, Class: "alpha"}); n != 8 || f != 1 {
			t.Fatalf("class alpha: %d locks, %d foreign; want 8 and 1", n, f)
		}
		seen := 0
		for range m.List(ctx, manager.ListOptions{Prefix: u, Count: 1}) {
			seen++
			if seen == 2 {
				break
			}
		}
		if seen != 2 {
			t.Fatalf("an early break saw %d", seen)
		}
	})
}
