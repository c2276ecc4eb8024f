package manager_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

// The client options most services run with: go-redis's defaults, with a
// read timeout long enough that anything waiting for it shows (30 s).
func slowClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A hung server (SIGSTOP: its sockets stay open, nothing answers) must not
// hold anything of shardlock's past its deadline: held locks are reported
// lost by their validity on the holder's clock, not when a read times out
// (30 s here), and calls return by their context's deadline. When the
// server wakes, the attempts whose callers had gone are released at once,
// not left for their TTL.
func TestRealHungServer(t *testing.T) {
	for _, coalescing := range []bool{true, false} {
		t.Run(fmt.Sprintf("coalescing %v", coalescing), func(t *testing.T) {
			srv := testenv.StartServer(t)
			c := slowClient(t, srv.Addr)
			admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
			t.Cleanup(func() { _ = admin.Close() })
			const ttl = time.Second
			m := newManager(t, c, manager.WithTTL(ttl), manager.WithCoalescing(coalescing))
			ctx := ctxT(t)
			var held []*manager.Lock
			for i := range 20 {
				l, err := m.TryAcquire(ctx, fmt.Sprintf("held-%d", i))
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, l)
			}

			srv.Stop()
			stopped := time.Now()
			// Every key expires by stopped+ttl at the latest (its last
			// renewal was sent before); the holders must know by then.
			// The bound allows for a slow machine, far below the 30 s an
			// I/O-bound watchdog would take.
			for _, l := range held {
				select {
				case <-l.Done():
				case <-time.After(time.Until(stopped.Add(ttl + 2*time.Second))):
					srv.Cont()
					t.Fatalf("lock %s not reported lost %v after the server hung (TTL %v)", l.Resource(), time.Since(stopped), ttl)
				}
				if !errors.Is(l.Err(), manager.ErrLockLost) {
					t.Fatalf("Err = %v, want ErrLockLost", l.Err())
				}
			}
			t.Logf("20 locks reported lost %v after the server hung (TTL %v)", time.Since(stopped), ttl)

			// Calls return by their deadline; what they sent stays in the
			// server's socket. First one alone, bounded by its wait limit
			// well before its context: its command is the one in flight.
			{
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				start := time.Now()
				_, err := m.Acquire(cctx, "late-first", manager.WithTTL(30*time.Second), manager.WithWait(300*time.Millisecond))
				cancel()
				if !errors.Is(err, manager.ErrNotAcquired) {
					t.Errorf("Acquire with a wait limit: %v, want ErrNotAcquired", err)
				}
				if d := time.Since(start); d > 2*time.Second {
					srv.Cont()
					t.Fatalf("Acquire with a 300 ms wait limit returned after %v", d)
				}
			}
			const calls = 16
			var wg sync.WaitGroup
			errs := make(chan error, calls)
			start := time.Now()
			for i := range calls {
				wg.Go(func() {
					res, ttl := fmt.Sprintf("late-%d", i), manager.WithTTL(30*time.Second)
					var err error
					switch i % 3 {
					case 0: // bounded by its context
						cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
						defer cancel()
						if _, err = m.Acquire(cctx, res, ttl); !errors.Is(err, context.DeadlineExceeded) {
							err = fmt.Errorf("Acquire: %v, want an error matching context.DeadlineExceeded", err)
						} else {
							err = nil
						}
					case 1:
						cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
						defer cancel()
						if _, err = m.TryAcquire(cctx, res, ttl); !errors.Is(err, context.DeadlineExceeded) {
							err = fmt.Errorf("TryAcquire: %v, want an error matching context.DeadlineExceeded", err)
						} else {
							err = nil
						}
					default: // bounded by its wait limit, well before its context
						cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
						defer cancel()
						if _, err = m.Acquire(cctx, res, ttl, manager.WithWait(300*time.Millisecond)); !errors.Is(err, manager.ErrNotAcquired) {
							err = fmt.Errorf("Acquire with a wait limit: %v, want ErrNotAcquired", err)
						} else {
							err = nil
						}
					}
					errs <- err
				})
			}
			wg.Wait()
			close(errs)
			if d := time.Since(start); d > 2*time.Second {
				srv.Cont()
				t.Fatalf("calls with a 300 ms deadline or wait limit returned after %v", d)
			}
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			for _, l := range held {
				rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				rstart := time.Now()
				_ = l.Release(rctx) // known lost: no round trip
				cancel()
				if d := time.Since(rstart); d > 2*time.Second {
					t.Fatalf("Release returned after %v", d)
				}
			}

			srv.Cont()
			// The server runs the attempts it had buffered; each one that
			// took its key is released as soon as its reply arrives, long
			// before its 30 s TTL.
			eventually(t, 5*time.Second, "late attempts released", func() bool {
				keys, err := admin.Keys(context.Background(), "shardlock:{late-*").Result()
				return err == nil && !slices.ContainsFunc(keys, func(k string) bool { return !sharding.IsHelperKey(k) })
			})
			// And locking works again with the same manager.
			l, err := m.TryAcquire(ctx, "after")
			if err != nil {
				t.Fatalf("after the server woke: %v", err)
			}
			_ = l.Release(ctx)
		})
	}
}

// A server that is killed: calls fail by their deadline with the cause
// kept, and the same manager locks again once the server is back.
func TestRealKilledServer(t *testing.T) {
	srv := testenv.StartServer(t)
	c := slowClient(t, srv.Addr)
	m := newManager(t, c, manager.WithTTL(time.Second))
	ctx := ctxT(t)
	l, err := m.TryAcquire(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	killed := time.Now()
	waitDone(t, l, 3*time.Second)
	if !errors.Is(l.Err(), manager.ErrLockLost) {
		t.Fatalf("Err = %v", l.Err())
	}
	t.Logf("lost %v after the kill (TTL 1 s)", time.Since(killed))

	for _, tt := range []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Acquire", func(ctx context.Context) error { _, err := m.Acquire(ctx, "r"); return err }},
		{"TryAcquire", func(ctx context.Context) error { _, err := m.TryAcquire(ctx, "r"); return err }},
		{"AcquireBatch", func(ctx context.Context) error { _, err := m.AcquireBatch(ctx, []string{"{g}:a", "{g}:b"}); return err }},
	} {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		start := time.Now()
		err := tt.call(cctx)
		cancel()
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("%s with a 300 ms deadline returned after %v", tt.name, d)
		}
		if err == nil || !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, manager.ErrNotAcquired) {
			t.Fatalf("%s = %v", tt.name, err)
		}
	}

	srv.Restart()
	eventually(t, 5*time.Second, "locking again after the restart", func() bool {
		l, err := m.TryAcquire(ctx, "again")
		if err != nil {
			return false
		}
		return l.Release(ctx) == nil
	})
}

// Nothing listens at the address: a waiting Acquire gives up at its wait
// limit, not the client's dial retries, and says why (both match): the
// refused connection, or that Redis did not answer in time while go-redis
// was still retrying its dials.
func TestDeadAddressHonoursTheWait(t *testing.T) {
	srv := testenv.StartServer(t)
	addr := srv.Addr
	srv.Kill() // the port is free now: nothing listens
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	m := newManager(t, c, manager.WithStartupCheck(false))
	start := time.Now()
	_, err := m.Acquire(context.Background(), "r", manager.WithWait(500*time.Millisecond))
	d := time.Since(start)
	if !errors.Is(err, manager.ErrNotAcquired) {
		t.Fatalf("got %v, want ErrNotAcquired", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("the cause was dropped: %v", err)
	}
	if d > 2*time.Second {
		t.Fatalf("Acquire with a 500 ms wait returned after %v", d)
	}
	t.Logf("after %v: %q", d, err.Error())
}
