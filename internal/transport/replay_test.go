package transport

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
)

// fakeCluster returns a cluster client whose one master, owning every
// slot, is f.
func fakeCluster(t *testing.T, f *fakeRESP) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: f.addr()}}}}, nil
		},
		Protocol: 2, DisableIdentity: true,
	})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func fakeStandalone(t *testing.T, f *fakeRESP) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: f.addr(), Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// fakeCoalescer returns a coalescer on a cluster or standalone client of f.
func fakeCoalescer(t *testing.T, f *fakeRESP, kind string) *coalescer {
	t.Helper()
	if kind == "cluster" {
		return testCoalescer(fakeCluster(t, f))
	}
	return testCoalescer(fakeStandalone(t, f))
}

func setNX(ctx context.Context, key, val string) *redis.StatusCmd {
	return redis.NewStatusCmd(ctx, "set", key, val, "nx")
}

// viaClusterPipeline sends cmds, in order, as one batch the way go-redis's
// auto-pipeliner sends each of its batches: through the cluster client's
// pipeline processing (ClusterClient.processPipeline), where its retries
// live. (The auto-pipeliner's own batching cannot be steered into one
// batch of given commands in a test.)
func viaClusterPipeline(t *testing.T, f *fakeRESP, cmds ...redis.Cmder) {
	t.Helper()
	pipe := fakeCluster(t, f).Pipeline()
	ctx := testCtx(t)
	for _, c := range cmds {
		_ = pipe.Process(ctx, c)
	}
	_, _ = pipe.Exec(ctx)
}

// waitQueued waits until n commands are queued (the queues have no
// signal: poll, bounded).
func waitQueued(t *testing.T, queued func() int, n int) {
	t.Helper()
	for j := 0; queued() != n; j++ {
		if j == 5000 {
			t.Fatalf("%d commands queued after 5 s, want %d", queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// viaCoalescer sends cmds as one batch through co, behind a command f
// holds, and returns their callers' errors.
func viaCoalescer(t *testing.T, f *fakeRESP, co *coalescer, cmds ...redis.Cmder) []error {
	t.Helper()
	t.Cleanup(func() { co.close(context.Background()) })
	ctx := testCtx(t)
	hold := make(chan error, 1)
	go func() { hold <- co.Process(ctx, redis.NewStatusCmd(ctx, "set", "hold", "x")) }()
	<-f.held
	errs := make([]chan error, len(cmds))
	for i, c := range cmds {
		errs[i] = make(chan error, 1)
		go func() { errs[i] <- co.Process(ctx, c) }()
		waitQueued(t, co.queuedLen, i+1) // in order: the next queues after this one
	}
	close(f.release)
	if err := <-hold; err != nil {
		t.Fatal(err)
	}
	out := make([]error, len(cmds))
	for i := range errs {
		out[i] = <-errs[i]
	}
	return out
}

// A TRYAGAIN at the head of a batch makes go-redis's cluster pipelines
// (and so its auto-pipeliner, which sends each batch through them) send
// the whole batch again: a SET NX that ran is run twice, and its caller is
// told it found the key taken (by its own value). The coalescer sends the
// TRYAGAIN'd command again alone, and every other command once.
func TestReplayTryAgainAtBatchHead(t *testing.T) {
	t.Run("go-redis cluster pipeline", func(t *testing.T) {
		f := startFakeRESP(t)
		ctx := testCtx(t)
		a, b := setNX(ctx, "tryagain", "a"), setNX(ctx, "k", "b")
		viaClusterPipeline(t, f, a, b)
		if n := f.count("set k b"); n != 2 {
			t.Fatalf("the answered SET reached the server %d times; this test shows a replay and expects 2", n)
		}
		if !errors.Is(b.Err(), redis.Nil) {
			t.Fatalf("replayed SET NX: %v, expected the replay's nil", b.Err())
		}
	})
	for _, kind := range []string{"cluster", "standalone"} {
		t.Run("coalescer/"+kind, func(t *testing.T) {
			f := startFakeRESP(t)
			co := fakeCoalescer(t, f, kind)
			ctx := testCtx(t)
			errs := viaCoalescer(t, f, co, setNX(ctx, "tryagain", "a"), setNX(ctx, "k", "b"))
			for i, err := range errs {
				if err != nil {
					t.Fatalf("caller %d: %v", i, err)
				}
			}
			if n := f.count("set k b"); n != 1 {
				t.Fatalf("the answered SET reached the server %d times, want 1", n)
			}
			if n := f.count("set tryagain a"); n != 2 {
				t.Fatalf("the TRYAGAIN'd SET reached the server %d times, want 2 (refused, then run)", n)
			}
		})
	}
}

// A connection cut after some of a batch's replies were read makes
// go-redis's cluster pipelines send the whole batch again, answered commands
// included. Through the coalescer the answered command keeps its reply and
// is not sent again; only the unanswered ones fail, with an error whose
// outcome is unknown (the lock calls settle those by their tokens).
func TestReplayConnectionCut(t *testing.T) {
	t.Run("go-redis cluster pipeline", func(t *testing.T) {
		f := startFakeRESP(t)
		ctx := testCtx(t)
		a := setNX(ctx, "a", "1")
		viaClusterPipeline(t, f, a, setNX(ctx, "cut", "2"), setNX(ctx, "c", "3"))
		if n := f.count("set a 1"); n != 2 {
			t.Fatalf("the answered SET reached the server %d times; this test shows a replay and expects 2", n)
		}
		if !errors.Is(a.Err(), redis.Nil) {
			t.Fatalf("replayed SET NX: %v, expected the replay's nil", a.Err())
		}
	})
	for _, kind := range []string{"cluster", "standalone"} {
		t.Run("coalescer/"+kind, func(t *testing.T) {
			f := startFakeRESP(t)
			co := fakeCoalescer(t, f, kind)
			ctx := testCtx(t)
			errs := viaCoalescer(t, f, co, setNX(ctx, "a", "1"), setNX(ctx, "cut", "2"), setNX(ctx, "c", "3"))
			if errs[0] != nil {
				t.Fatalf("the answered SET: %v", errs[0])
			}
			for i, err := range errs[1:] {
				if !IsAmbiguous(err) {
					t.Fatalf("unanswered command %d: %v, want an error whose outcome is unknown", i+1, err)
				}
			}
			// The server reads no further than the cut.
			for c, want := range map[string]int{"set a 1": 1, "set cut 2": 1, "set c 3": 0} {
				if n := f.count(c); n != want {
					t.Fatalf("%q reached the server %d times, want %d", c, n, want)
				}
			}
		})
	}
}

// Off, the lock calls' commands are never sent twice either: not after a
// lost reply (go-redis's own retries), not after a "not now".
func TestOnceNeverRetries(t *testing.T) {
	f := startFakeRESP(t)
	ctx := testCtx(t)
	o := newOnce(fakeStandalone(t, f))
	if err := o.Process(ctx, setNX(ctx, "cut", "1")); !IsAmbiguous(err) {
		t.Fatalf("cut: %v", err)
	}
	if err := o.Process(ctx, setNX(ctx, "tryagain", "1")); !IsNotNow(err) {
		t.Fatalf("tryagain: %v", err)
	}
	for _, c := range []string{"set cut 1", "set tryagain 1"} {
		if n := f.count(c); n != 1 {
			t.Fatalf("%q reached the server %d times, want 1", c, n)
		}
	}
}

// The calls shardlock pipelines through the client itself (a multi-slot
// acquire's groups, Close's and a MultiLock's releases, the watchdog's
// renewals) are sent once each too: after a TRYAGAIN at the head of a
// node's batch, the other calls keep their replies and the TRYAGAIN'd one
// carries it, for its caller to retry; after a connection cut, the
// answered call keeps its reply and only the unanswered ones carry the
// error, none of them sent again.
func TestRunBatchSendsEachCallOnce(t *testing.T) {
	calls := func(keys ...string) []ScriptCall {
		out := make([]ScriptCall, len(keys))
		for i, k := range keys {
			out[i] = ScriptCall{Script: scripts.Extend, Keys: []string{k}, Args: []any{"token", "1000"}}
		}
		return out
	}
	for _, kind := range []string{"cluster", "standalone"} {
		client := func(f *fakeRESP) redis.UniversalClient {
			if kind == "cluster" {
				return fakeCluster(t, f)
			}
			return fakeStandalone(t, f)
		}
		t.Run(kind+"/tryagain", func(t *testing.T) {
			f := startFakeRESP(t)
			cs := calls("tryagain", "k")
			RunBatch(testCtx(t), client(f), cs)
			if !IsTryAgain(cs[0].Cmd.Err()) {
				t.Fatalf("the TRYAGAIN'd call: %v, want its TRYAGAIN", cs[0].Cmd.Err())
			}
			if v, err := cs[1].Cmd.Int64(); err != nil || v != 1 {
				t.Fatalf("the answered call: %v, %v", v, err)
			}
			for _, k := range []string{"tryagain", "k"} {
				if n := f.count("evalsha " + k); n != 1 {
					t.Fatalf("the call on %q reached the server %d times, want 1", k, n)
				}
			}
		})
		t.Run(kind+"/cut", func(t *testing.T) {
			f := startFakeRESP(t)
			cs := calls("a", "cut", "c")
			RunBatch(testCtx(t), client(f), cs)
			if v, err := cs[0].Cmd.Int64(); err != nil || v != 1 {
				t.Fatalf("the answered call: %v, %v", v, err)
			}
			for i, c := range cs[1:] {
				if !IsAmbiguous(c.Cmd.Err()) {
					t.Fatalf("unanswered call %d: %v, want an error whose outcome is unknown", i+1, c.Cmd.Err())
				}
			}
			for k, want := range map[string]int{"a": 1, "cut": 1, "c": 0} {
				if n := f.count("evalsha " + k); n != want {
					t.Fatalf("the call on %q reached the server %d times, want %d", k, n, want)
				}
			}
		})
	}
}
