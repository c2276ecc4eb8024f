package manager_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap/zaptest/observer"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

// onConditional reports whether the real-server tests run on a server
// whose masters run the conditional commands and MSETEX: Valkey 9 (DELIFEQ)
// or Redis 8.4 and later (DELEX ... IFEQ); see
// TestRealServersAreTheExpectedOnes.
func onConditional() bool {
	s := os.Getenv("SHARDLOCK_SERVER")
	return s == "valkey" || s == "redis8"
}

// condDel is the name of the conditional delete the Manager sends where
// the server has one: DELEX on Redis 8, which has no DELIFEQ, else DELIFEQ.
func condDel() string {
	if os.Getenv("SHARDLOCK_SERVER") == "redis8" {
		return "delex"
	}
	return "delifeq"
}

// nameHook records the names of the commands a client sends, alone or in
// pipelines (a new connection's handshake left out: the pool may dial
// during any call), and may rename one on its way (as rename-command would make
// the server see it).
type nameHook struct {
	mu     sync.Mutex
	names  map[string]int
	rename map[string]string
}

func newNameHook() *nameHook { return &nameHook{names: map[string]int{}} }

func (h *nameHook) see(cmd redis.Cmder) {
	inner := unwrapCmd(cmd)
	name := inner.Name()
	switch name {
	case "hello", "auth", "client", "select":
		return // a new connection's handshake, not a call's command
	}
	h.mu.Lock()
	defer h.mu.Unlock()
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

// snapshot returns the counts so far.
func (h *nameHook) snapshot() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.names)
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

// nativeAndScript is what the tests of a native path against its script
// run on: two Managers under one key prefix on their own clients of tg's
// server, one at its defaults (the native kinds where the server has the
// commands; h counts what its client sends) and one with
// WithConditionalCommands(false), and a client of the test's own.
type nativeAndScript struct {
	admin          redis.UniversalClient
	h              *nameHook
	native, script *manager.Manager
	prefix         string
}

func newNativeAndScript(t *testing.T, tg testenv.Target, name string) nativeAndScript {
	p := nativeAndScript{admin: tg.Client(t), h: newNameHook(), prefix: testenv.Unique(name) + ":"}
	nc, sc := tg.Client(t), tg.Client(t)
	addHook(nc, p.h)
	p.native = newManager(t, nc, manager.WithKeyPrefix(p.prefix), manager.WithOwner("native"))
	p.script = newManager(t, sc, manager.WithKeyPrefix(p.prefix), manager.WithOwner("script"), manager.WithConditionalCommands(false))
	return p
}

// replaceWithHash makes key a hash (of another application, say) that
// expires in a minute.
func replaceWithHash(t *testing.T, ctx context.Context, admin redis.UniversalClient, key string) {
	t.Helper()
	if err := admin.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.HSet(ctx, key, "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.PExpire(ctx, key, time.Minute).Err(); err != nil {
		t.Fatal(err)
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
// Valkey 9 and Redis 8) answer what the scripts answer, case by case: a
// lock held, expired (its key gone), held by another token,
// force-released, a key of another type, and one with a waiter queued in
// Redis (the queued mark), which the release hands over. There the default
// manager sends DELIFEQ (Valkey) or DELEX ... IFEQ (Redis 8) and SET ...
// IFEQ for these calls; on Redis 7 it cannot, and sends the scripts.
func TestRealConditionalPathsAnswerAsTheScripts(t *testing.T) {
	for _, tg := range []testenv.Target{testenv.Targets()[0], testenv.Targets()[2]} {
		t.Run(tg.Name, func(t *testing.T) {
			ctx := ctxT(t)
			p := newNativeAndScript(t, tg, "cond")
			admin, h, native, script := p.admin, p.h, p.native, p.script
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
					replaceWithHash(t, ctx, admin, l.Key())
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
					dels, evalsha := h.count(condDel()), h.count("evalsha")
					switch {
					case onConditional() && (dels != 2 || evalsha != 0 || h.count("set") != 3):
						t.Errorf("held: %d %s, %d EVALSHA, %d SET; want 2 (2 releases), 0 and 3 (2 acquires, 1 extend)", dels, condDel(), evalsha, h.count("set"))
					case !onConditional() && dels != 0:
						t.Errorf("held, on Redis 7: %d %s sent to a server without it", dels, condDel())
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
// failover to an older replica, rename-command: here a hook renames the
// conditional delete, DELIFEQ or DELEX, on its way, so that the server
// answers "unknown command"), no call fails: it goes by the script, the
// Manager says so once in its log and uses the scripts from then on. (On
// Redis 7 every release goes by the script from the start, silently.)
func TestRealConditionalCommandsGoneFallBack(t *testing.T) {
	ctx := ctxT(t)
	c := testenv.Standalone(t)
	h := newNameHook()
	h.rename = map[string]string{condDel(): condDel() + "-renamed"}
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
	want := 0 // Redis 7: New found no conditional delete, nothing to fall back from
	if onConditional() {
		want = 1 // the first one's unknown command turns them off
	}
	if n := h.count(condDel()); n != want {
		t.Errorf("%d %s sent, want %d", n, condDel(), want)
	}
	if n := logs.FilterMessageSnippet("conditional commands").Len(); n != want {
		t.Errorf("%d log lines about the conditional commands, want %d", n, want)
	}
	if n := h.count("evalsha"); n != 3 {
		t.Errorf("%d EVALSHA, want 3 (every release by the script)", n)
	}
}

// A Valkey 9 or Redis 8 server of the test's own with its conditional
// delete (DELIFEQ, DELEX) renamed away by its configuration
// (rename-command), as managed services ship it: a Manager made on it
// releases by the script from the start; a Manager made while the server
// had the command, which then comes back without it (a rolling upgrade or
// downgrade in place), falls back on the first "unknown command" and says
// so once, and takes the commands up again once the server has them back.
// No call fails for it either way.
func TestRealRenamedDelifeqFallsBack(t *testing.T) {
	if !onConditional() {
		t.Skip("the conditional delete is Valkey 9's and Redis 8's: Redis 7 refuses to rename a command it does not have")
	}
	del := condDel()
	renamed := []string{"--rename-command", strings.ToUpper(del), ""}
	// onOwnServer starts a server of the test's own with args and makes a
	// Manager on it, whose commands h counts and whose log logs holds.
	onOwnServer := func(t *testing.T, args ...string) (*testenv.Server, *redis.Client, *nameHook, *manager.Manager, *observer.ObservedLogs) {
		srv := testenv.StartServerWith(t, args...)
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		h := newNameHook()
		c.AddHook(h)
		log, logs := observedLogger()
		return srv, c, h, newManager(t, c, manager.WithLogger(log)), logs
	}
	cycle := func(t *testing.T, ctx context.Context, m *manager.Manager, n int) {
		t.Helper()
		for i := range n {
			l, err := m.TryAcquire(ctx, "r")
			if err != nil {
				t.Fatalf("acquire %d: %v", i, err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatalf("release %d: %v", i, err)
			}
		}
	}
	t.Run("renamed before New", func(t *testing.T) {
		ctx := ctxT(t)
		_, _, h, m, logs := onOwnServer(t, renamed...)
		cycle(t, ctx, m, 3)
		if n := h.count(del); n != 0 {
			t.Errorf("%d %s sent to a server without it", n, del)
		}
		if n := h.count("evalsha"); n != 3 {
			t.Errorf("%d EVALSHA, want 3 (every release by the script)", n)
		}
		if n := logs.FilterMessageSnippet("conditional commands").Len(); n != 0 {
			t.Errorf("%d log lines about the conditional commands, want none: New chose the scripts", n)
		}
	})
	t.Run("renamed after New, then back", func(t *testing.T) {
		manager.SetConditionalRecheck(t, 100*time.Millisecond)
		ctx := ctxT(t)
		srv, c, h, m, logs := onOwnServer(t)
		cycle(t, ctx, m, 1)
		if n := h.count(del); n != 1 {
			t.Fatalf("%d %s before the restart, want 1", n, del)
		}
		srv.RestartWith(renamed...)
		// go-redis drops the pooled connections the restart broke as it
		// takes them; wait until the server answers.
		eventually(t, 5*time.Second, "a connection to the restarted server", func() bool {
			return c.Ping(ctx).Err() == nil
		})
		h.reset()
		cycle(t, ctx, m, 3)
		if n := h.count(del); n != 1 {
			t.Errorf("%d %s after the restart, want 1 (the first release's, answered unknown command)", n, del)
		}
		if n := logs.FilterMessageSnippet("conditional commands").Len(); n != 1 {
			t.Errorf("%d log lines about the conditional commands, want 1", n)
		}
		if n := h.count("evalsha") + h.count("eval"); n < 3 {
			t.Errorf("%d scripts run, want at least 3 (every release by the script)", n)
		}

		// The server comes back with the command: the Manager's next
		// look at the command tables turns the commands on again.
		srv.RestartWith()
		eventually(t, 10*time.Second, del+" in use again", func() bool {
			h.reset()
			l, err := m.TryAcquire(ctx, "r")
			if err != nil {
				return false
			}
			return l.Release(ctx) == nil && h.count(del) == 1
		})
		if n := logs.FilterMessageSnippet("conditional commands again").Len(); n != 1 {
			t.Errorf("%d log lines about the conditional commands coming back, want 1", n)
		}
	})
}

// commandStats reads the calls of each command from INFO commandstats of
// the server behind c, script-internal commands included, leaving out
// what reading them, setting up connections and New's look at the command
// table send.
func commandStats(t *testing.T, ctx context.Context, c *redis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":")
		if !ok || !strings.HasPrefix(rest, "calls=") {
			continue
		}
		switch {
		case name == "info", name == "ping", name == "hello", name == "select",
			strings.HasPrefix(name, "config|"), strings.HasPrefix(name, "client|"), strings.HasPrefix(name, "command|"):
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		out[name] = n
	}
	return out
}

// The commands an uncontended acquire+release sends, and those of a
// hand-over between managers (as processes), at a lock's first contention
// and while it stays contended, counted by the server (INFO commandstats
// of a server of the test's own), Lua's internal commands included: the
// per-call table of docs/design.md. The log lines give the totals.
func TestRealCommandsPerCall(t *testing.T) {
	ctx := ctxT(t)
	srv := testenv.StartServer(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	var ms [3]*manager.Manager
	for i := range ms {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		defer c.Close()
		ms[i] = newManager(t, c, manager.WithOwner(fmt.Sprintf("p%d", i)))
	}
	// Once each first, so that the scripts are loaded and the connections
	// and subscriptions open.
	for _, m := range ms {
		l, err := m.TryAcquire(ctx, "warm")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	reset := func() {
		if err := admin.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}

	reset()
	l, err := ms[0].TryAcquire(ctx, "solo")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got := commandStats(t, ctx, admin)
	want := map[string]int64{"set": 1, "evalsha": 1, "get": 1, "del": 1} // release.lua: GET, DEL
	if onConditional() {
		want = map[string]int64{"set": 1, condDel(): 1}
	}
	if !maps.Equal(got, want) {
		t.Errorf("uncontended acquire+release sent %v, want %v", got, want)
	}

	// The hand-over: p0 holds, p1 and then p2 wait in Redis's queue, p0
	// releases to p1.
	held, err := ms[0].TryAcquire(ctx, "handover")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   *manager.Lock
		err error
	}
	queue := sharding.QueueKey(held.Key())
	wait := func(m *manager.Manager, n int64) <-chan result {
		done := make(chan result, 1)
		go func() {
			l, err := m.Acquire(ctx, "handover", manager.WithWait(10*time.Second))
			done <- result{l, err}
		}()
		eventually(t, 5*time.Second, "the waiter in the queue", func() bool { return admin.LLen(ctx, queue).Val() == n })
		return done
	}
	took := func(done <-chan result) *manager.Lock {
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.l
	}
	release := func(l *manager.Lock) {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// measure runs step and returns the commands it sent (the queue polls
	// of wait left out).
	//
	// A waiter re-checks every 100 ms whatever the step does, by
	// acquire_queue.lua: still queued, GET, LPOS and PTTL; handed the
	// lock and not yet told, GET and PEXPIRE (no step sends LPOS or
	// PEXPIRE itself, once the holders' claims are confirmed). A
	// re-check that falls into a step's window is not the step's, and is
	// taken out.
	measure := func(step func()) map[string]int64 {
		reset()
		step()
		got := commandStats(t, ctx, admin)
		delete(got, "llen")
		queued, claimed := got["lpos"], got["pexpire"]
		if queued+claimed > 0 {
			t.Logf("%d re-checks of a queued waiter and %d of a waiter handed the lock during the step, taken out", queued, claimed)
			for c, n := range map[string]int64{"evalsha": queued + claimed, "get": queued + claimed, "lpos": queued, "pttl": queued, "pexpire": claimed} {
				if got[c] -= n; got[c] <= 0 {
					delete(got, c)
				}
			}
		}
		return got
	}
	// confirmed waits until the holder of l, handed over on the claim
	// lease, has confirmed it (its watchdog extends the key about 50 ms
	// after the claim), so that the confirmation's commands do not fall
	// into a later measurement.
	confirmed := func(l *manager.Lock) {
		eventually(t, 5*time.Second, "the claim lease confirmed", func() bool {
			return admin.PTTL(ctx, l.Key()).Val() > scripts.ClaimLease
		})
	}
	var p1, p2, p0 <-chan result
	waiting := measure(func() { p1 = wait(ms[1], 1) })
	p2 = wait(ms[2], 2)
	handover := measure(func() { release(held) })
	l1 := took(p1)
	confirmed(l1)

	// Then as it goes on while the lock stays contended: p0, whose
	// release handed the lock over, waits again; the queue is in use
	// (p2), so it joins at once; p1 releases to p2.
	join := measure(func() { p0 = wait(ms[0], 2) })
	steady := measure(func() { release(l1) })
	l2 := took(p2)
	release(l2) // to p0
	l0 := took(p0)
	confirmed(l0)
	last := measure(func() { release(l0) })

	total := func(m map[string]int64) (n int64) {
		for _, v := range m {
			n += v
		}
		return n
	}
	delete(join, "ssubscribe") // p0's first wait subscribes the lock's channels, once
	t.Logf("first wait: %v; first hand-over: %v", waiting, handover)
	t.Logf("a join of a contended lock: %v; its hand-over: %v; the last release: %v", join, steady, last)
	t.Logf("commands per acquisition: %d at the first contention, %d while contended", total(waiting)+total(handover), total(join)+total(steady))
	// The first contention goes by the scripts on every server: the
	// releaser took the lock uncontended, so its conditional delete (on
	// Valkey 9 and Redis 8) finds the mark the waiter set and the script
	// follows.
	if n := handover[condDel()]; n > 1 {
		t.Errorf("the hand-over sent %d %s, want at most 1", n, condDel())
	}
	if waiting["evalsha"] != 1 || handover["evalsha"] != 1 {
		t.Errorf("%d and %d scripts run by the first wait and hand-over, want 1 each", waiting["evalsha"], handover["evalsha"])
	}
	// While contended, Valkey 9 and Redis 8 join with RPUSHX (and, once
	// per Manager and queueTTLSlack, extend the queue's expiry) and hand
	// over with hand_on.lua (LPOP, SET ... IFEQ and SPUBLISH); the last
	// release of a lock handed over finds the queue empty: the script's
	// LPOP, the conditional delete and the "free" announcement. Redis 7
	// runs the scripts.
	if !onConditional() {
		if join["evalsha"] != 1 || steady["evalsha"] != 1 || last["evalsha"] != 1 {
			t.Errorf("on Redis, %d, %d and %d scripts run by the join, the hand-over and the last release, want 1 each", join["evalsha"], steady["evalsha"], last["evalsha"])
		}
		return
	}
	for _, c := range []struct {
		name      string
		got, want map[string]int64
	}{
		{"join", join, map[string]int64{"rpushx": 1, "pexpireat": 1}},
		{"hand-over", steady, map[string]int64{"evalsha": 1, "lpop": 1, "set": 1, "spublish": 1}},
		{"last release", last, map[string]int64{"evalsha": 1, "lpop": 1, condDel(): 1, "spublish": 1}},
	} {
		if !maps.Equal(c.got, c.want) {
			t.Errorf("the %s sent %v, want %v", c.name, c.got, c.want)
		}
	}
}

// An unfenced batch's first try is MSETEX ... NX PX on a server that runs
// it (Valkey 9.1, Redis 8.4; on a cluster whose masters do not route it by
// its keys' slot, Valkey 9.1, in a transaction: see msetexInTx): a free
// batch is taken in that one command; a batch
// with a key held by another token, with the queued mark, or of another
// type answers what the script answers (the same error, the same held
// resources) and takes nothing.
func TestRealMsetexBatchAnswersAsTheScript(t *testing.T) {
	for _, tg := range []testenv.Target{testenv.Targets()[0], testenv.Targets()[2]} {
		t.Run(tg.Name, func(t *testing.T) {
			ctx := ctxT(t)
			p := newNativeAndScript(t, tg, "msetex")
			admin, h, native, script, prefix := p.admin, p.h, p.native, p.script, p.prefix
			cases := []struct {
				name  string
				spoil func(t *testing.T, key string) // done to the batch's second key first
			}{
				{"free", func(*testing.T, string) {}},
				{"another token", func(t *testing.T, key string) {
					if err := admin.Set(ctx, key, "sl1.someone-else", time.Minute).Err(); err != nil {
						t.Fatal(err)
					}
				}},
				{"queued mark", func(t *testing.T, key string) {
					if err := admin.Set(ctx, key, "sl1.someone-else"+sharding.QueuedMark, time.Minute).Err(); err != nil {
						t.Fatal(err)
					}
				}},
				{"another type", func(t *testing.T, key string) {
					if err := admin.HSet(ctx, key, "f", "v").Err(); err != nil {
						t.Fatal(err)
					}
					if err := admin.PExpire(ctx, key, time.Minute).Err(); err != nil {
						t.Fatal(err)
					}
				}},
			}
			type outcome struct {
				err  string
				held string
				free int // keys of the batch other than the spoilt one left free
			}
			run := func(m *manager.Manager, side, name string, spoil func(*testing.T, string)) outcome {
				tag := "{" + side + "-" + name + "}"
				res := []string{tag + "a", tag + "b", tag + "c"}
				keys := make([]string, len(res))
				for i, r := range res {
					keys[i] = prefix + r
				}
				spoil(t, keys[1])
				l, err := m.TryAcquireBatch(ctx, res)
				o := outcome{err: strings.ReplaceAll(errClass(err), tag, "{tag}")}
				var bhe *manager.BatchHeldError
				if errors.As(err, &bhe) {
					o.held = strings.TrimPrefix(strings.Join(bhe.Held, ","), tag)
				}
				if err == nil {
					for _, k := range keys {
						if v := admin.Get(ctx, k).Val(); v != l.Token() {
							t.Errorf("%s: %s holds %q, not the batch's token", name, k, v)
						}
						if ttl := admin.PTTL(ctx, k).Val(); ttl <= 0 || ttl > manager.DefaultTTL {
							t.Errorf("%s: %s has TTL %v", name, k, ttl)
						}
					}
					if err := l.Release(ctx); err != nil {
						t.Errorf("%s: release: %v", name, err)
					}
				}
				for _, k := range []string{keys[0], keys[2]} {
					if admin.Exists(ctx, k).Val() == 0 {
						o.free++
					}
				}
				return o
			}
			for _, c := range cases {
				h.reset()
				got, want := run(native, "n", c.name, c.spoil), run(script, "s", c.name, c.spoil)
				if got != want {
					t.Errorf("%s: MSETEX answered %+v, the script %+v", c.name, got, want)
				}
				msetex, evalsha, exec := h.count("msetex"), h.count("evalsha"), h.count("exec")
				uses := onConditional()
				// A Valkey 9.1 cluster node runs MSETEX whichever node
				// serves its keys: the batch sends it there in a
				// transaction whose EXISTS the node routes.
				tx := uses && tg.Name == "cluster" && os.Getenv("SHARDLOCK_SERVER") != "redis8"
				switch {
				case !uses && msetex != 0:
					t.Errorf("%s: %d MSETEX sent (Redis 7 has none)", c.name, msetex)
				case tx && (exec != 1 || h.count("multi") != 1 || h.count("exists") != 1):
					t.Errorf("%s: %d MULTI, %d EXISTS, %d EXEC, want one transaction", c.name, h.count("multi"), h.count("exists"), exec)
				case !tx && exec != 0:
					t.Errorf("%s: %d EXEC sent, want MSETEX alone", c.name, exec)
				case uses && msetex != 1:
					t.Errorf("%s: %d MSETEX, want 1 (the first try)", c.name, msetex)
				case uses && c.name == "free" && evalsha != 1:
					t.Errorf("free: %d EVALSHA, want 1 (the release only)", evalsha)
				}
			}
		})
	}
}
