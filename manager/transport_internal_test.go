package manager

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// goroutineHook records, per command name, whether a command was sent on
// a goroutine running inSender: the caller's, as opposed to one of the
// Manager's (an exchange's or a flusher's).
type goroutineHook struct {
	mu        sync.Mutex
	elsewhere map[string]int // sends on another goroutine, by command
	sends     map[string]int
}

func (h *goroutineHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *goroutineHook) record(cmds ...redis.Cmder) {
	buf := make([]byte, 64<<10)
	onCaller := strings.Contains(string(buf[:runtime.Stack(buf, false)]), "manager.inSender(")
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range cmds {
		h.sends[c.Name()]++
		if !onCaller {
			h.elsewhere[c.Name()]++
		}
	}
}

func (h *goroutineHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.record(cmd); return next(ctx, cmd) }
}

func (h *goroutineHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.record(cmds...); return next(ctx, cmds) }
}

// inSender runs f; the hook finds it on the stack of f's sends.
//
//go:noinline
func inSender(f func()) { f() }

// A lone caller whose context never ends (context.Background), or ends
// later than the attempt can use a reply (a deadline past the TTL), sends
// its commands on its own goroutine: the client bounds each command by the
// attempt's deadline, and nothing else could end the wait. Without a
// client that bounds commands by their context (ContextTimeoutEnabled), a
// command under a context that never ends still goes out on the caller's
// goroutine: a flusher would wait for its reply just as long.
func TestContextsThatNeverEndStayOnTheCallersGoroutine(t *testing.T) {
	for _, bounds := range []bool{true, false} {
		t.Run(map[bool]string{true: "ContextTimeoutEnabled", false: "client timeouts"}[bounds], func(t *testing.T) {
			mr := miniredis.RunT(t)
			c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: bounds})
			t.Cleanup(func() { _ = c.Close() })
			m, err := New(context.Background(), c, WithStartupCheck(false))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.Close(context.Background()) })
			h := &goroutineHook{elsewhere: map[string]int{}, sends: map[string]int{}}
			c.AddHook(h)
			late, cancel := context.WithTimeout(context.Background(), time.Hour) // past the 30 s TTL
			defer cancel()
			for _, ctx := range []context.Context{context.Background(), late} {
				inSender(func() {
					l, err := m.TryAcquire(ctx, "r")
					if err != nil {
						t.Fatal(err)
					}
					if err := l.Release(context.Background()); err != nil {
						t.Fatal(err)
					}
				})
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.sends["set"] != 2 || h.sends["evalsha"] != 2 {
				t.Fatalf("sent %v, want 2 SETs and 2 EVALSHAs", h.sends)
			}
			if n := h.elsewhere["evalsha"]; n > 0 {
				t.Errorf("%d of 2 releases under context.Background() sent on a goroutine of the Manager's", n)
			}
			if n := h.elsewhere["set"]; bounds && n > 0 {
				t.Errorf("%d of 2 attempts sent on a goroutine of the Manager's", n)
			}
		})
	}
}

// exchangeHook records, at each EVALSHA sent, how many exchanges the
// Manager had in flight on goroutines of its own, and holds that send
// while hold is set, until release is closed.
type exchangeHook struct {
	m        atomic.Pointer[Manager]
	hold     atomic.Bool
	held     chan struct{}
	release  chan struct{}
	mu       sync.Mutex
	inFlight []int64
}

func (h *exchangeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *exchangeHook) record(cmds ...redis.Cmder) {
	for _, c := range cmds {
		if c.Name() != "evalsha" {
			continue
		}
		h.mu.Lock()
		h.inFlight = append(h.inFlight, h.m.Load().io.n.Load())
		h.mu.Unlock()
		if h.hold.Load() {
			select {
			case h.held <- struct{}{}:
			default:
			}
			<-h.release
		}
	}
}

func (h *exchangeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.record(cmd); return next(ctx, cmd) }
}

func (h *exchangeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.record(cmds...); return next(ctx, cmds) }
}

// A release under a context that can be cancelled but has no deadline (a
// request's context, say) waits for its reply in the coalescer alone, with
// no exchange goroutine of the Manager's beside it, and still returns as
// soon as its context is cancelled.
func TestCancellableReleaseWaitsInTheCoalescer(t *testing.T) {
	h := &exchangeHook{held: make(chan struct{}, 1), release: make(chan struct{})}
	m, _ := newMiniManager(t, h)
	h.m.Store(m)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l, err := m.TryAcquire(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	if len(h.inFlight) != 1 || h.inFlight[0] != 0 {
		t.Errorf("exchanges in flight beside the release's EVALSHA: %v, want [0]", h.inFlight)
	}
	h.mu.Unlock()

	// Cancelled while its EVALSHA is in flight, the release returns at once.
	l, err = m.TryAcquire(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	h.hold.Store(true)
	defer func() { h.hold.Store(false); close(h.release) }()
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Release(rctx) }()
	<-h.held
	rcancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Release cancelled in flight: %v, want an error matching context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Release did not return after its context was cancelled")
	}
}
