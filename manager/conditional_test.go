package manager_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

// onValkey reports whether the real-server tests run on Valkey 9, whose
// masters run DELIFEQ and SET ... IFEQ (see TestRealServersAreTheExpectedOnes).
func onValkey() bool { return os.Getenv("SHARDLOCK_SERVER") == "valkey" }

// nameHook records the names of the commands a client sends, alone or in
// pipelines, and may rename one on its way (as rename-command would make
// the server see it).
type nameHook struct {
	mu     sync.Mutex
	names  map[string]int
	rename map[string]string
}

func newNameHook() *nameHook { return &nameHook{names: map[string]int{}} }

func (h *nameHook) see(cmd redis.Cmder) {
	inner := unwrapCmd(cmd)
	h.mu.Lock()
	defer h.mu.Unlock()
	name := inner.Name()
	if to, ok := h.rename[name]; ok {
		inner.Args()[0] = to
	}
	h.names[name]++
}

func (h *nameHook) count(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.names[name]
}

func (h *nameHook) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.names)
}

func (h *nameHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *nameHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.see(cmd); return next(ctx, cmd) }
}
func (h *nameHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.see(c)
		}
		return next(ctx, cmds)
	}
}

// errClass names which of the errors callers tell apart err matches.
func errClass(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, manager.ErrForceReleased):
		return "ErrForceReleased"
	case errors.Is(err, manager.ErrNotHeld):
		return "ErrNotHeld"
	case errors.Is(err, manager.ErrExpired):
		return "ErrExpired"
	case errors.Is(err, manager.ErrReleased):
		return "ErrReleased"
	}
	return "other: " + err.Error()
}

// The conditional commands' release and extend (kindExclusiveNative, on
// Valkey 9) answer what the scripts answer, case by case: a lock held,
// expired (its key gone), held by another token, force-released, a key of
// another type, and one with a waiter queued in Redis (the queued mark),
// which the release hands over. On Valkey the default manager sends
// DELIFEQ and SET ... IFEQ for these calls; on Redis 7 it cannot, and
// sends the scripts.
func TestRealConditionalPathsAnswerAsTheScripts(t *testing.T) {
	for _, tg := range []testenv.Target{testenv.Targets()[0], testenv.Targets()[2]} {
		t.Run(tg.Name, func(t *testing.T) {
			ctx := ctxT(t)
			admin := tg.Client(t)
			nc, sc := tg.Client(t), tg.Client(t)
			h := newNameHook()
			addHook(nc, h)
			prefix := testenv.Unique("cond") + ":"
			native := newManager(t, nc, manager.WithKeyPrefix(prefix), manager.WithOwner("native"))
			script := newManager(t, sc, manager.WithKeyPrefix(prefix), manager.WithOwner("script"), manager.WithConditionalCommands(false))
			// spoil does to the key what the case is about, after the lock
			// was taken.
			cases := []struct {
				name  string
				spoil func(t *testing.T, m *manager.Manager, l *manager.Lock)
			}{
				{"held", func(*testing.T, *manager.Manager, *manager.Lock) {}},
				{"expired", func(t *testing.T, _ *manager.Manager, l *manager.Lock) {
					if err := admin.Del(ctx, l.Key()).Err(); err != nil {
						t.Fatal(err)
					}
				}},
				{"another token", func(t *testing.T, _ *manager.Manager, l *manager.Lock) {
					if err := admin.Set(ctx, l.Key(), "sl1.someone-else", time.Minute).Err(); err != nil {
						t.Fatal(err)
					}
				}},
				{"force-released", func(t *testing.T, m *manager.Manager, l *manager.Lock) {
					if err := m.ForceRelease(ctx, l.Resource(), "test"); err != nil {
						t.Fatal(err)
					}
				}},
				{"another type", func(t *testing.T, _ *manager.Manager, l *manager.Lock) {
					if err := admin.Del(ctx, l.Key()).Err(); err != nil {
						t.Fatal(err)
					}
					if err := admin.HSet(ctx, l.Key(), "f", "v").Err(); err != nil {
						t.Fatal(err)
					}
					if err := admin.PExpire(ctx, l.Key(), time.Minute).Err(); err != nil {
						t.Fatal(err)
					}
				}},
			}
			type outcome struct{ release, extend string }
			run := func(m *manager.Manager, side, name string, spoil func(*testing.T, *manager.Manager, *manager.Lock)) outcome {
				var o outcome
				for _, op := range []string{"release", "extend"} {
					l, err := m.TryAcquire(ctx, side+":"+name+":"+op)
					if err != nil {
						t.Fatal(err)
					}
					spoil(t, m, l)
					if op == "release" {
						o.release = errClass(l.Release(ctx))
					} else {
						o.extend = errClass(l.Extend(ctx, time.Minute))
						_ = l.Release(ctx)
					}
				}
				return o
			}
			for _, c := range cases {
				h.reset()
				got, want := run(native, "n", c.name, c.spoil), run(script, "s", c.name, c.spoil)
				if got != want {
					t.Errorf("%s: conditional commands answered %+v, the scripts %+v", c.name, got, want)
				}
				if c.name == "held" {
					if want != (outcome{"nil", "nil"}) {
						t.Errorf("held: %+v, want nil for both", want)
					}
					delifeq, evalsha := h.count("delifeq"), h.count("evalsha")
					switch {
					case onValkey() && (delifeq != 2 || evalsha != 0 || h.count("set") != 3):
						t.Errorf("held, on Valkey: %d DELIFEQ, %d EVALSHA, %d SET; want 2 (2 releases), 0 and 3 (2 acquires, 1 extend)", delifeq, evalsha, h.count("set"))
					case !onValkey() && delifeq != 0:
						t.Errorf("held, on Redis: %d DELIFEQ sent to a server without it", delifeq)
					}
				}
			}

			// A waiter queued in Redis: the release finds the queued mark and
			// hands the lock over, as the script does.
			l, err := native.TryAcquire(ctx, "queued")
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() {
				wl, err := script.Acquire(ctx, "queued")
				if err == nil {
					err = wl.Release(ctx)
				}
				got <- err
			}()
			qk := sharding.QueueKey(l.Key())
			eventually(t, 10*time.Second, "the waiter queued in Redis", func() bool { return admin.LLen(ctx, qk).Val() > 0 })
			if err := l.Release(ctx); err != nil {
				t.Fatalf("release with a waiter queued: %v", err)
			}
			if err := <-got; err != nil {
				t.Fatalf("the queued waiter: %v", err)
			}
		})
	}
}

// Where the conditional commands stop being there after New found them (a
// failover to an older replica, rename-command: here a hook renames
// DELIFEQ on its way, so that the server answers "unknown command"), no
// call fails: it goes by the script, the Manager says so once in its log
// and uses the scripts from then on. (On Redis 7 every release goes by the
// script from the start, silently.)
func TestRealConditionalCommandsGoneFallBack(t *testing.T) {
	ctx := ctxT(t)
	c := testenv.Standalone(t)
	h := newNameHook()
	h.rename = map[string]string{"delifeq": "delifeq-renamed"}
	c.AddHook(h)
	log, logs := observedLogger()
	m := newManager(t, c, manager.WithKeyPrefix(testenv.Unique("gone")+":"), manager.WithLogger(log))
	for i := range 3 {
		l, err := m.TryAcquire(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
	want := 0 // Redis 7: New found no DELIFEQ, nothing to fall back from
	if onValkey() {
		want = 1 // the first one's unknown command turns them off
	}
	if n := h.count("delifeq"); n != want {
		t.Errorf("%d DELIFEQ sent, want %d", n, want)
	}
	if n := logs.FilterMessageSnippet("conditional commands").Len(); n != want {
		t.Errorf("%d log lines about the conditional commands, want %d", n, want)
	}
	if n := h.count("evalsha"); n != 3 {
		t.Errorf("%d EVALSHA, want 3 (every release by the script)", n)
	}
}
