package manager

import (
	"context"
	"runtime"
	"strings"
	"sync"
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
