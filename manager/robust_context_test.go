package manager_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// countHookByName counts the commands (pipelined ones included) a client
// sends, by name.
type countHookByName struct{ n map[string]*atomic.Int64 }

func newCountHook(names ...string) *countHookByName {
	h := &countHookByName{n: map[string]*atomic.Int64{}}
	for _, n := range names {
		h.n[n] = new(atomic.Int64)
	}
	return h
}

func (h *countHookByName) count(cmd redis.Cmder) {
	if c := h.n[cmd.Name()]; c != nil {
		c.Add(1)
	}
	if c := h.n["*"]; c != nil {
		c.Add(1)
	}
}

func (h *countHookByName) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHookByName) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.count(cmd); return next(ctx, cmd) }
}
func (h *countHookByName) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.count(c)
		}
		return next(ctx, cmds)
	}
}

// A call with a context that has already ended returns the context's error
// and sends nothing, auto-pipelined or not. Release hands the lock to the
// background reaper instead (it must not stay held and renewed).
func TestRealEndedContextSendsNothing(t *testing.T) {
	for _, coalescing := range []bool{true, false} {
		name := "coalescing off"
		if coalescing {
			name = "coalescing on"
		}
		t.Run(name, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: testenv.StandaloneAddr(t)})
			t.Cleanup(func() { _ = c.Close() })
			hook := newCountHook("*")
			c.AddHook(hook)
			m := newManager(t, c, manager.WithCoalescing(coalescing))
			live := ctxT(t)
			held, err := m.TryAcquire(live, testenv.Unique("held"))
			if err != nil {
				t.Fatal(err)
			}
			cancelled, cancel := context.WithCancel(context.Background())
			cancel()
			expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
			defer cancel2()
			for ctxName, ctx := range map[string]context.Context{"cancelled": cancelled, "expired": expired} {
				res := testenv.Unique("ended")
				calls := []struct {
					name string
					call func() error
				}{
					{"TryAcquire", func() error { _, err := m.TryAcquire(ctx, res); return err }},
					{"Acquire", func() error { _, err := m.Acquire(ctx, res); return err }},
					{"TryAcquireBatch", func() error { _, err := m.TryAcquireBatch(ctx, []string{"{" + res + "}:a"}); return err }},
					{"AcquireBatch", func() error { _, err := m.AcquireBatch(ctx, []string{"{" + res + "}:a"}); return err }},
					{"AcquireMulti", func() error { _, err := m.AcquireMulti(ctx, []string{res + "-a", res + "-b"}); return err }},
					{"TryAcquireMulti", func() error { _, err := m.TryAcquireMulti(ctx, []string{res + "-a", res + "-b"}); return err }},
					{"AcquireAny", func() error { _, err := m.AcquireAny(ctx, res, 3); return err }},
					{"AcquireStripe", func() error { _, err := m.AcquireStripe(ctx, res, 3, "p"); return err }},
					{"Do", func() error { return m.Do(ctx, res, func(context.Context) error { return nil }) }},
					{"Extend", func() error { return held.Extend(ctx, 5*time.Second) }},
					{"TTL", func() error { _, err := held.TTL(ctx); return err }},
				}
				for _, call := range calls {
					t.Run(ctxName+"/"+call.name, func(t *testing.T) {
						before := hook.n["*"].Load()
						err := call.call()
						if !errors.Is(err, ctx.Err()) {
							t.Fatalf("got %v, want an error matching %v", err, ctx.Err())
						}
						if n := hook.n["*"].Load() - before; n != 0 {
							t.Fatalf("sent %d commands", n)
						}
						if keys := c.Keys(live, "shardlock:*"+res+"*").Val(); len(keys) != 0 {
							t.Fatalf("keys written: %v", keys)
						}
					})
				}
			}
			t.Run("Release", func(t *testing.T) {
				if err := held.Release(cancelled); !errors.Is(err, context.Canceled) {
					t.Fatalf("Release = %v", err)
				}
				// Not left held and renewed until Close: released in the background.
				eventually(t, 5*time.Second, "released in the background", func() bool { return c.Exists(live, held.Key()).Val() == 0 })
			})
		})
	}
}

// Close with a context that has already ended still releases what it
// holds (one bounded try) instead of leaving the keys for their TTL.
func TestRealCloseWithEndedContextReleases(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m, err := manager.New(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		live := ctxT(t)
		l, err := m.TryAcquire(live, testenv.Unique("close"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := m.TryAcquireBatch(live, []string{"{" + testenv.Unique("close") + "}:a"})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := m.Close(ctx); err != nil {
			t.Fatalf("Close = %v", err)
		}
		for _, k := range append(l.Keys(), b.Keys()...) {
			if c.Exists(live, k).Val() != 0 {
				t.Fatalf("%s still held after Close", k)
			}
		}
		<-l.Done()
		<-b.Done()
	})
}

// The watchdog backs off after a failed renewal instead of retrying at
// once, logs once when renewals start failing, and stops on an error that
// cannot heal (a closed client).
func TestRealWatchdogBacksOffAndStops(t *testing.T) {
	t.Run("transient failures back off", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: testenv.StandaloneAddr(t)})
		t.Cleanup(func() { _ = c.Close() })
		counts := newCountHook("evalsha") // outermost: sees what the fault hook refuses
		c.AddHook(counts)
		fault := &faultHook{cmd: "evalsha"}
		c.AddHook(fault)
		logger, logs := observedLogger()
		m := newManager(t, c, manager.WithCoalescing(false), manager.WithTTL(time.Second), manager.WithLogger(logger))
		l, err := m.TryAcquire(ctxT(t), testenv.Unique("backoff"))
		if err != nil {
			t.Fatal(err)
		}
		fault.n.Store(1 << 30) // every renewal fails from now on
		before := counts.n["evalsha"].Load()
		waitDone(t, l, 5*time.Second)
		tries := counts.n["evalsha"].Load() - before
		// First renewal at ~333 ms, then retries 10, 20, 40, ... ms apart
		// (at most 500 ms) until the validity (~988 ms) runs out: about
		// eight. Retrying at once made thousands.
		if tries < 2 || tries > 30 {
			t.Fatalf("%d renewal attempts in one validity", tries)
		}
		if n := logs.FilterMessageSnippet("renewal failed").Len(); n != 1 {
			t.Fatalf("%d 'renewal failed' lines, want 1", n)
		}
		if !strings.Contains(l.Err().Error(), "failed in a row") {
			t.Fatalf("Err = %v, want the count of failed renewals", l.Err())
		}
		t.Logf("%d renewal attempts, then: %v", tries, l.Err())
	})
	t.Run("closed client", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: testenv.StandaloneAddr(t)})
		logger, logs := observedLogger()
		m := newManager(t, c, manager.WithCoalescing(false), manager.WithTTL(3*time.Second),
			manager.WithRenewInterval(100*time.Millisecond), manager.WithLogger(logger.WithOptions(zap.IncreaseLevel(zap.WarnLevel))))
		l, err := m.TryAcquire(ctxT(t), testenv.Unique("closed"))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
		// Lost at its next renewal (100 ms), not at the end of its validity (3 s).
		waitDone(t, l, 2*time.Second)
		if !errors.Is(l.Err(), manager.ErrLockLost) || !errors.Is(l.Err(), redis.ErrClosed) {
			t.Fatalf("Err = %v, want ErrLockLost and redis.ErrClosed", l.Err())
		}
		if n := logs.Len(); n > 3 {
			t.Fatalf("%d log lines", n)
		}
	})
}

// gateHook holds the renew client's renewals (EVALSHA) until released, and
// counts them.
type gateHook struct {
	arrived chan struct{} // one value per renewal that reached the hook
	release chan struct{} // closed to let held renewals through
	n       atomic.Int64
}

func (h *gateHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if c.Name() == "evalsha" {
				h.n.Add(1)
				select {
				case h.arrived <- struct{}{}:
				default:
				}
				<-h.release
				break
			}
		}
		return next(ctx, cmds)
	}
}

// An Extend that succeeds while a watchdog renewal is in flight makes that
// renewal's result the older one; the watchdog must still schedule the
// next renewal (from the Extend), not leave the lock to its validity.
func TestRealExtendDuringRenewalKeepsRenewing(t *testing.T) {
	c := testenv.Standalone(t)
	rc := redis.NewClient(&redis.Options{Addr: testenv.StandaloneAddr(t)})
	t.Cleanup(func() { _ = rc.Close() })
	gate := &gateHook{arrived: make(chan struct{}, 8), release: make(chan struct{})}
	rc.AddHook(gate)
	m := newManager(t, c, manager.WithTTL(time.Second), manager.WithRenewInterval(100*time.Millisecond), manager.WithRenewClient(rc))
	ctx := ctxT(t)
	l, err := m.TryAcquire(ctx, testenv.Unique("extend"))
	if err != nil {
		t.Fatal(err)
	}
	<-gate.arrived // the first renewal is in flight, held at the gate
	if err := l.Extend(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	close(gate.release)
	// The next renewal comes one interval after the Extend; without it the
	// lock is lost when its validity runs out (about 1 s).
	for gate.n.Load() < 2 {
		select {
		case <-gate.arrived:
		case <-l.Done():
			t.Fatalf("lost with no renewal after the Extend: %v", l.Err())
		}
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
