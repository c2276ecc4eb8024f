package manager_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

// lostReplyHook runs every release, batch release and extend script (and
// the conditional commands that stand for them on Valkey 9), then
// reports its reply lost (io.ErrUnexpectedEOF), as a connection cut after
// the command was written would, the first time it sees those exact
// arguments: the Manager then sends the call again, knowing that the
// first may have run. In a pipeline, every command after the first such
// script loses its reply too. replays counts the lost replies.
type lostReplyHook struct {
	replays *atomic.Int64
	seen    *sync.Map
}

// localReplays counts the lost releases that carried a local waiter's
// entry (ARGV[2]), which may hand it the lock.
var localReplays atomic.Int64

func replayed(cmd redis.Cmder) bool {
	args := cmd.Args()
	switch cmd.Name() {
	case "delifeq", "delex": // the conditional commands' release and extend (Valkey 9, Redis 8)
		return true
	case "set":
		return len(args) > 3 && fmt.Sprint(args[3]) == "ifeq"
	}
	if len(args) < 2 || (cmd.Name() != "evalsha" && cmd.Name() != "eval") {
		return false
	}
	for _, s := range []*redis.Script{scripts.Release, scripts.ReleaseBatch, scripts.Extend, scripts.ExtendBatch} {
		if args[1] == s.Hash() {
			return true
		}
	}
	return false
}

// lose reports whether cmd's reply is to be lost: the first run of a
// replayed script with its arguments.
func (h lostReplyHook) lose(cmd redis.Cmder) bool {
	if !replayed(cmd) {
		return false
	}
	seen := cmd.Args()[2:] // a script's keys and arguments
	if n := cmd.Name(); n != "evalsha" && n != "eval" {
		seen = cmd.Args() // a conditional command, whole
	}
	if _, again := h.seen.LoadOrStore(fmt.Sprint(seen), true); again {
		return false
	}
	h.replays.Add(1)
	if a := cmd.Args(); len(a) > 5 && a[1] == scripts.Release.Hash() && a[5] != "" {
		localReplays.Add(1)
	}
	return true
}

func (h lostReplyHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h lostReplyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.lose(cmd) {
			cmd.SetErr(io.ErrUnexpectedEOF)
			return io.ErrUnexpectedEOF
		}
		return err
	}
}

func (h lostReplyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for i, c := range cmds {
			if h.lose(c) {
				for _, c := range cmds[i:] {
					c.SetErr(io.ErrUnexpectedEOF)
				}
				return io.ErrUnexpectedEOF
			}
		}
		return err
	}
}

// replayingTargets runs f on the standalone server and the cluster, with
// a client that loses the first reply of each release and extend script.
func replayingTargets(t *testing.T, f func(t *testing.T, c redis.UniversalClient, replays *atomic.Int64)) {
	t.Run("standalone", func(t *testing.T) {
		var n atomic.Int64
		c := redis.NewClient(&redis.Options{Addr: testenv.StandaloneAddr(t), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		c.AddHook(lostReplyHook{&n, &sync.Map{}})
		f(t, c, &n)
	})
	t.Run("cluster", func(t *testing.T) {
		var n atomic.Int64
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.ClusterAddrs(t), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		seen := &sync.Map{}
		c.OnNewNode(func(n2 *redis.Client) { n2.AddHook(lostReplyHook{&n, seen}) })
		f(t, c, &n)
	})
}

// A release, a batch release or an extend whose reply is lost is sent
// again, and the second run's answer settles it: the lock is released (or
// extended), not reported lost, and nothing is left beside the keys.
func TestRealReplayedReleaseAndExtend(t *testing.T) {
	replayingTargets(t, func(t *testing.T, c redis.UniversalClient, replays *atomic.Int64) {
		m := newManager(t, c, manager.WithWatchdog(false))
		ctx := ctxT(t)
		l, err := m.TryAcquire(ctx, testenv.Unique("replay"))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Extend(ctx, time.Minute); err != nil {
			t.Fatalf("replayed extend: %v", err)
		}
		if ttl := c.PTTL(ctx, l.Key()).Val(); ttl < 50*time.Second {
			t.Fatalf("TTL %v after the extend", ttl)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("replayed release: %v", err)
		}
		if n := c.Exists(ctx, l.Key()).Val(); n != 0 {
			t.Fatal("the key is still there")
		}
		nothingBeside(t, c, l.Key())
		tag := testenv.Unique("replay-batch")
		b, err := m.TryAcquireBatch(ctx, []string{"{" + tag + "}:a", "{" + tag + "}:b"})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Release(ctx); err != nil {
			t.Fatalf("replayed batch release: %v", err)
		}
		for _, k := range b.Keys() {
			nothingBeside(t, c, k)
		}
		if n := c.Exists(ctx, b.Keys()...).Val(); n != 0 {
			t.Fatalf("%d of the batch's keys are still there", n)
		}
		if replays.Load() < 3 {
			t.Fatalf("%d replays: the hook did not replay the calls", replays.Load())
		}
	})
}

// nothingBeside checks that no key of key's slot starts with key: the lock
// key and the helper keys beside it are gone.
func nothingBeside(t *testing.T, c redis.UniversalClient, key string) {
	t.Helper()
	ctx := ctxT(t)
	keys, err := c.Keys(ctx, key+"*").Result() // one node's keys: the slot's
	if cc, ok := c.(*redis.ClusterClient); ok {
		var node *redis.Client
		node, err = cc.MasterForKey(ctx, key)
		if err == nil {
			keys, err = node.Keys(ctx, key+"*").Result()
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		t.Fatalf("left beside the released lock: %q", keys)
	}
}

// A release that hands the lock to a queued waiter, whose reply is lost,
// hands it once: the first waiter holds it, the second still waits, and
// the releaser, sending again, is told it released.
func TestRealReplayedHandOver(t *testing.T) {
	replayingTargets(t, func(t *testing.T, c redis.UniversalClient, replays *atomic.Int64) {
		ctx := ctxT(t)
		res := testenv.Unique("replay-hand")
		holder := newManager(t, c, slowRecheck, manager.WithOwner("holder"))
		var ws []*manager.Manager
		for _, o := range []string{"first", "second"} {
			ws = append(ws, newManager(t, c, slowRecheck, manager.WithOwner(o)))
		}
		l, err := holder.TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan acquired, 2)
		for i, w := range ws {
			go func() {
				l, err := w.Acquire(ctx, res, manager.WithWait(20*time.Second))
				got <- acquired{who: i, l: l, err: err}
			}()
			eventually(t, 5*time.Second, "waiter queued", func() bool { return queueLen(t, c, l.Key()) == int64(i+1) })
		}
		before := replays.Load()
		if err := l.Release(ctx); err != nil {
			t.Fatalf("replayed hand-over: %v", err)
		}
		if replays.Load() == before {
			t.Fatal("the release was not replayed")
		}
		first := <-got
		if first.err != nil || first.who != 0 {
			t.Fatalf("handed to waiter %d: %v", first.who, first.err)
		}
		if v := c.Get(ctx, l.Key()).Val(); v != first.l.Token() && v != first.l.Token()+sharding.QueuedMark {
			t.Fatalf("key holds %q, not the first waiter's token", v)
		}
		if n := queueLen(t, c, l.Key()); n != 1 {
			t.Fatalf("%d waiters queued after one hand-over, want 1", n)
		}
		select {
		case second := <-got:
			t.Fatalf("the second waiter got the lock too: %v", second.err)
		default:
		}
		if err := first.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		second := <-got
		if second.err != nil || second.who != 1 {
			t.Fatalf("then waiter %d: %v", second.who, second.err)
		}
		if err := second.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		nothingBeside(t, c, l.Key())
		if _, err := c.Get(ctx, l.Key()).Result(); !errors.Is(err, redis.Nil) {
			t.Fatalf("the key is left: %v", err)
		}
	})
}

// Releases that hand the lock to their own process's next waiter, whose
// replies are lost, answer the hand-over when sent again (the second run
// finds that waiter's token in the key): every
// release succeeds and every waiter gets the lock once, fences rising.
func TestRealReplayedLocalHandOver(t *testing.T) {
	replayingTargets(t, func(t *testing.T, c redis.UniversalClient, replays *atomic.Int64) {
		ctx := ctxT(t)
		res := testenv.Unique("replay-local")
		m := newManager(t, c, slowRecheck, manager.WithOwner("local"), manager.WithFencing(true))
		before := localReplays.Load()
		var (
			mu     sync.Mutex
			fences []uint64
			wg     sync.WaitGroup
		)
		for range 4 {
			wg.Go(func() {
				for range 5 {
					l, err := m.Acquire(ctx, res)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					fences = append(fences, l.Fence()) // in acquisition order: the lock is held
					mu.Unlock()
					time.Sleep(time.Millisecond) // hold it a moment, as a caller would
					if err := l.Release(ctx); err != nil {
						t.Errorf("replayed release: %v", err)
					}
				}
			})
		}
		wg.Wait()
		if len(fences) != 20 {
			t.Fatalf("%d acquisitions", len(fences))
		}
		for i := 1; i < len(fences); i++ {
			if fences[i] <= fences[i-1] {
				t.Fatalf("fence %d after %d", fences[i], fences[i-1])
			}
		}
		if localReplays.Load() == before {
			t.Fatal("no release carrying a local waiter was replayed")
		}
	})
}
