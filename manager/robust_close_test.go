package manager_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// closeLimit is the context Close gets in these tests: far longer than
// the Close they expect, so that one that waits it out is told apart.
const closeLimit = 20 * time.Second

// An Acquire against an address where nothing listens sends nothing that
// could hold a lock (every dial is refused, or the wait ends while one is
// under way): Close then releases nothing and returns at once, without
// waiting out its context or reporting locks that were never taken.
func TestCloseAfterAnUnreachableServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	m, err := manager.New(context.Background(), c, manager.WithStartupCheck(false))
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := m.Acquire(actx, "unreachable", manager.WithWait(500*time.Millisecond)); !errors.Is(err, manager.ErrNotAcquired) {
		t.Fatalf("Acquire = %v, want ErrNotAcquired", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeLimit)
	defer cancel()
	if err := m.Close(ctx); err != nil {
		t.Errorf("Close = %v, want nil: no lock was taken", err)
	}
	if ctx.Err() != nil {
		t.Errorf("Close waited out its context")
	}
}

// A held lock whose server dies: Close tries to release it until the
// lock would have expired anyway (its TTL, 2 s here), then reports it,
// rather than trying until its context ends.
func TestCloseGivesUpAtTheLocksExpiry(t *testing.T) {
	srv := testenv.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	m, err := manager.New(context.Background(), c, manager.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryAcquire(ctxT(t), testenv.Unique("dies")); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), closeLimit)
	defer cancel()
	if err := m.Close(ctx); err == nil {
		t.Error("Close = nil, want the lock it could not release")
	}
	if ctx.Err() != nil {
		t.Errorf("Close waited out its context")
	}
}

// After Close every call that would go to Redis returns ErrClosed and
// sends nothing.
func TestClosedManagerSendsNothing(t *testing.T) {
	_, c := miniClient(t)
	m := newManager(t, c)
	ctx := ctxT(t)
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var trips, cmds atomic.Int64
	c.AddHook(&countHook{&trips, &cmds})
	calls := map[string]func() error{
		"Acquire":          func() error { _, err := m.Acquire(ctx, "r"); return err },
		"TryAcquire":       func() error { _, err := m.TryAcquire(ctx, "r"); return err },
		"AcquireAny":       func() error { _, err := m.AcquireAny(ctx, "r", 3); return err },
		"TryAcquireAny":    func() error { _, err := m.TryAcquireAny(ctx, "r", 3); return err },
		"AcquireStripe":    func() error { _, err := m.AcquireStripe(ctx, "r", 4, "p"); return err },
		"TryAcquireStripe": func() error { _, err := m.TryAcquireStripe(ctx, "r", 4, "p"); return err },
		"AcquireBatch":     func() error { _, err := m.AcquireBatch(ctx, []string{"{g}a", "{g}b"}); return err },
		"TryAcquireBatch":  func() error { _, err := m.TryAcquireBatch(ctx, []string{"{g}a", "{g}b"}); return err },
		"AcquireMulti":     func() error { _, err := m.AcquireMulti(ctx, []string{"a", "b"}); return err },
		"TryAcquireMulti":  func() error { _, err := m.TryAcquireMulti(ctx, []string{"a", "b"}); return err },
		"AcquireRead":      func() error { _, err := m.AcquireRead(ctx, "rw"); return err },
		"AcquireWrite":     func() error { _, err := m.AcquireWrite(ctx, "rw"); return err },
		"Do":               func() error { return m.Do(ctx, "r", func(context.Context) error { return nil }) },
		"Campaign":         func() error { _, err := m.Campaign(ctx, "e"); return err },
		"Leader":           func() error { _, err := m.Leader(ctx, "e"); return err },
		"Observe":          func() error { _, err := m.Observe(ctx, "e"); return err },
		"Inspect":          func() error { _, err := m.Inspect(ctx, "r"); return err },
		"ForceRelease":     func() error { return m.ForceRelease(ctx, "r", "why") },
		"Resume":           func() error { _, err := m.Resume(ctx, "r", "sl1.x"); return err },
		"List": func() error {
			for _, err := range m.List(ctx, manager.ListOptions{}) {
				return err
			}
			return nil
		},
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, manager.ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", name, err)
		}
	}
	if n := cmds.Load(); n != 0 {
		t.Errorf("%d commands sent after Close", n)
	}
}

// holdHook holds the first command that runs script until release is
// closed, after telling held.
type holdHook struct {
	script  *redis.Script
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

func (h *holdHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 1 && a[1] == h.script.Hash() {
			h.once.Do(func() {
				close(h.held)
				<-h.release
			})
		}
		return next(ctx, cmd)
	}
}
func (h *holdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// An Extend or a TTL read that the holder's own Release overtakes (its
// script runs after the release's) answers ErrReleased, not ErrExpired:
// the lock was released, not lost.
func TestExtendAndTTLOvertakenByReleaseAnswerReleased(t *testing.T) {
	for name, call := range map[string]struct {
		script *redis.Script
		run    func(ctx context.Context, l *manager.Lock) error
	}{
		"Extend": {scripts.Extend, func(ctx context.Context, l *manager.Lock) error { return l.Extend(ctx, time.Minute) }},
		"TTL":    {scripts.PTTL, func(ctx context.Context, l *manager.Lock) error { _, err := l.TTL(ctx); return err }},
	} {
		t.Run(name, func(t *testing.T) {
			_, c := miniClient(t)
			h := &holdHook{script: call.script, held: make(chan struct{}), release: make(chan struct{})}
			c.AddHook(h)
			m := newManager(t, c, manager.WithCoalescing(false), manager.WithWatchdog(false))
			ctx := ctxT(t)
			l, err := m.TryAcquire(ctx, "overtaken")
			if err != nil {
				t.Fatal(err)
			}
			errc := make(chan error, 1)
			go func() { errc <- call.run(ctx, l) }()
			<-h.held
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			close(h.release)
			if err := <-errc; !errors.Is(err, manager.ErrReleased) {
				t.Fatalf("%s overtaken by Release = %v, want ErrReleased", name, err)
			}
		})
	}
}
