package manager_test

import (
	"context"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/shardlock/shardlock/internal/benchkit"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// miniClient starts a miniredis server and returns it with a client; both
// are closed at cleanup.
func miniClient(t testing.TB) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return mr, c
}

// newManager returns a Manager closed at cleanup (before the client: cleanups run last-in first-out).
func newManager(t testing.TB, c redis.UniversalClient, opts ...manager.Option) *manager.Manager {
	t.Helper()
	return benchkit.NewManager(t, c, opts...)
}

func observedLogger() (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zap.DebugLevel)
	return zap.New(core), logs
}

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitDone waits for a lock's Done channel, failing the test after limit.
func waitDone(t testing.TB, l *manager.Lock, limit time.Duration) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(limit):
		t.Fatalf("Done did not close within %v", limit)
	}
}

// timeoutErr looks like a network read timeout: the command may have run.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout (injected)" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// faultHook injects faults into the first n commands whose name is cmd.
// lostReply runs the command and then reports a timeout (the reply was
// lost); otherwise the command is not sent and a timeout is reported.
type faultHook struct {
	cmd       string
	lostReply bool
	n         atomic.Int64
	seen      atomic.Int64 // commands of any name processed
	ranOK     atomic.Bool  // a command whose reply was lost ran without an error reply
}

func (h *faultHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *faultHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.seen.Add(1)
		if cmd.Name() == h.cmd && h.n.Add(-1) >= 0 {
			if h.lostReply {
				h.ranOK.Store(next(ctx, cmd) == nil)
			}
			cmd.SetErr(timeoutErr{})
			return cmd.Err()
		}
		return next(ctx, cmd)
	}
}

// In a pipeline, a fault on any matching command fails the whole pipeline
// (as a dropped connection would).
func (h *faultHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.seen.Add(int64(len(cmds)))
		for _, cmd := range cmds {
			if cmd.Name() == h.cmd && h.n.Add(-1) >= 0 {
				if h.lostReply {
					h.ranOK.Store(next(ctx, cmds) == nil)
				}
				for _, c := range cmds {
					c.SetErr(timeoutErr{})
				}
				return timeoutErr{}
			}
		}
		return next(ctx, cmds)
	}
}

// eventually polls cond every 10 ms until it holds or limit passes. It is
// for server-side state that has no signal (a key expiring).
func eventually(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// assertFencesRise acquires and releases resource n times and checks that
// every fence is above the one before.
func assertFencesRise(t testing.TB, m *manager.Manager, resource string, n int) {
	t.Helper()
	ctx := ctxT(t)
	var last uint64
	for range n {
		l, err := m.TryAcquire(ctx, resource)
		if err != nil {
			t.Fatal(err)
		}
		if l.Fence() <= last {
			t.Fatalf("fence %d after %d", l.Fence(), last)
		}
		last = l.Fence()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// countingCluster returns a client of the real cluster that counts its round
// trips: every command and every per-node pipeline it sends.
func countingCluster(t *testing.T) (*redis.ClusterClient, *atomic.Int64) {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.ClusterAddrs(t)})
	t.Cleanup(func() { _ = c.Close() })
	var trips, cmds atomic.Int64
	c.OnNewNode(func(node *redis.Client) { node.AddHook(&countHook{pipelines: &trips, cmds: &cmds}) })
	return c, &trips
}

// unwrapCmd returns the command shardlock wrapped cmd around (it wraps
// every command so that go-redis never retries it), or cmd itself.
func unwrapCmd(cmd redis.Cmder) redis.Cmder {
	v := reflect.ValueOf(cmd)
	if v.Kind() == reflect.Pointer && v.Elem().Kind() == reflect.Struct {
		v = v.Elem()
	}
	if v.Kind() == reflect.Struct && v.NumField() == 1 && v.Type().Field(0).Anonymous {
		if inner, ok := v.Field(0).Interface().(redis.Cmder); ok {
			return inner
		}
	}
	return cmd
}

// matchHook counts the commands a client sends, alone or in pipelines,
// that match.
type matchHook struct {
	match func(redis.Cmder) bool
	n     atomic.Int64
}

func (h *matchHook) count(cmd redis.Cmder) {
	if h.match(cmd) {
		h.n.Add(1)
	}
}

func (h *matchHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *matchHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.count(cmd); return next(ctx, cmd) }
}
func (h *matchHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.count(c)
		}
		return next(ctx, cmds)
	}
}

// addHook adds h to c; on a cluster client, to every node client it makes
// instead, which every command and pipeline goes through once.
func addHook(c redis.UniversalClient, h redis.Hook) {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		c.AddHook(h)
		return
	}
	cc.OnNewNode(func(n *redis.Client) { n.AddHook(h) })
	_ = cc.ForEachShard(context.Background(), func(_ context.Context, n *redis.Client) error { n.AddHook(h); return nil })
}
