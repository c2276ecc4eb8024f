package manager_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// forEachTarget runs f against the real standalone server and the real cluster.
func forEachTarget(t *testing.T, f func(t *testing.T, c redis.UniversalClient)) {
	for _, target := range testenv.Targets() {
		t.Run(target.Name, func(t *testing.T) { f(t, target.Client(t)) })
	}
}

func TestRealAcquireReleaseResults(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m := newManager(t, c)
		ctx := ctxT(t)
		res := testenv.Unique("res")

		l, err := m.TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Get(ctx, l.Key()).Val(); got != l.Token() {
			t.Fatalf("stored %q", got)
		}
		if pttl := c.PTTL(ctx, l.Key()).Val(); pttl <= 0 || pttl > manager.DefaultTTL {
			t.Fatalf("PTTL %v", pttl)
		}
		if _, err := m.TryAcquire(ctx, res); !errors.Is(err, manager.ErrNotAcquired) {
			t.Fatalf("contended = %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if c.Exists(ctx, l.Key()).Val() != 0 {
			t.Fatal("key left after Release")
		}

		l2, err := m.TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		c.Set(ctx, l2.Key(), "thief", time.Minute)
		if err := l2.Release(ctx); !errors.Is(err, manager.ErrNotHeld) {
			t.Fatalf("Release of stolen key = %v", err)
		}
		if c.Get(ctx, l2.Key()).Val() != "thief" {
			t.Fatal("Release deleted another owner's key")
		}
		c.Del(ctx, l2.Key())

		l3, err := m.TryAcquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		c.Del(ctx, l3.Key())
		if err := l3.Release(ctx); !errors.Is(err, manager.ErrExpired) {
			t.Fatalf("Release of a gone key = %v", err)
		}
	})
}

func TestRealExtendNeverRecreates(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m := newManager(t, c, manager.WithWatchdog(false))
		ctx := ctxT(t)
		l, err := m.TryAcquire(ctx, testenv.Unique("res"), manager.WithTTL(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Extend(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		if d, err := l.TTL(ctx); err != nil || d < 50*time.Second {
			t.Fatalf("TTL after Extend(1m) = %v, %v", d, err)
		}
		c.Del(ctx, l.Key())
		if err := l.Extend(ctx, time.Minute); !errors.Is(err, manager.ErrExpired) {
			t.Fatalf("Extend of a gone key = %v", err)
		}
		if c.Exists(ctx, l.Key()).Val() != 0 {
			t.Fatal("Extend re-created the key")
		}
		if !errors.Is(l.Err(), manager.ErrLockLost) {
			t.Fatalf("Err = %v", l.Err())
		}
	})
}

// The key really expires on the server at its TTL, and the holder learns it
// by its own clock.
func TestRealExpiry(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m := newManager(t, c, manager.WithWatchdog(false))
		ctx := ctxT(t)
		l, err := m.TryAcquire(ctx, testenv.Unique("res"), manager.WithTTL(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		waitDone(t, l, 5*time.Second)
		if !errors.Is(l.Err(), manager.ErrLockLost) {
			t.Fatalf("Err = %v", l.Err())
		}
		eventually(t, 5*time.Second, "key expired on the server", func() bool { return c.Exists(ctx, l.Key()).Val() == 0 })
	})
}

// The watchdog keeps a lock alive well past its TTL.
func TestRealWatchdogRenews(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m := newManager(t, c)
		ctx := ctxT(t)
		ttl := 300 * time.Millisecond
		l, err := m.TryAcquire(ctx, testenv.Unique("res"), manager.WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-l.Done():
			t.Fatalf("lost while the watchdog ran: %v", l.Err())
		case <-time.After(4 * ttl):
		}
		if d, err := l.TTL(ctx); err != nil || d <= 0 {
			t.Fatalf("TTL after 4 TTLs = %v, %v", d, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestRealLossDetectedWithinRenewPeriod(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		const interval = 100 * time.Millisecond
		m := newManager(t, c, manager.WithTTL(3*time.Second), manager.WithRenewInterval(interval))
		ctx := ctxT(t)
		for _, tamper := range []struct {
			name string
			do   func(key string)
			want error
		}{
			{"deleted", func(key string) { c.Del(ctx, key) }, manager.ErrExpired},
			{"overwritten", func(key string) { c.Set(ctx, key, "thief", time.Minute) }, manager.ErrNotHeld},
		} {
			l, err := m.TryAcquire(ctx, testenv.Unique("res"))
			if err != nil {
				t.Fatal(err)
			}
			tamper.do(l.Key())
			start := time.Now()
			// One renewal period, plus slack for a loaded 2-core machine.
			waitDone(t, l, interval+time.Second)
			took := time.Since(start)
			<-l.Context().Done()
			if !errors.Is(l.Err(), manager.ErrLockLost) || !errors.Is(l.Err(), tamper.want) {
				t.Fatalf("%s: Err = %v", tamper.name, l.Err())
			}
			t.Logf("%s: loss seen after %v (renew interval %v)", tamper.name, took, interval)
		}
	})
}

func TestRealMaxHold(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m := newManager(t, c)
		ctx := ctxT(t)
		l, err := m.TryAcquire(ctx, testenv.Unique("res"), manager.WithTTL(300*time.Millisecond),
			manager.WithMaxHold(400*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		<-l.Context().Done()
		if !errors.Is(context.Cause(l.Context()), manager.ErrMaxHoldExceeded) {
			t.Fatalf("cause = %v", context.Cause(l.Context()))
		}
		if c.Exists(ctx, l.Key()).Val() != 1 {
			t.Fatal("key gone at max hold: it should live out its TTL")
		}
		waitDone(t, l, 5*time.Second)
		eventually(t, 5*time.Second, "key expired after max hold", func() bool { return c.Exists(ctx, l.Key()).Val() == 0 })
		if !errors.Is(l.Err(), manager.ErrMaxHoldExceeded) {
			t.Fatalf("Err = %v", l.Err())
		}
	})
}

func TestRealFencing(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m := newManager(t, c, manager.WithFencing(true))
		assertFencesRise(t, m, testenv.Unique("res"), 20)
	})
}

func TestRealCloseReleases(t *testing.T) {
	forEachTarget(t, func(t *testing.T, c redis.UniversalClient) {
		m, err := manager.New(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		ctx := ctxT(t)
		var locks []*manager.Lock
		for range 50 {
			l, err := m.TryAcquire(ctx, testenv.Unique("res"))
			if err != nil {
				t.Fatal(err)
			}
			locks = append(locks, l)
		}
		if err := m.Close(ctx); err != nil {
			t.Fatal(err)
		}
		for _, l := range locks {
			<-l.Done()
			if l.Err() != nil || c.Exists(ctx, l.Key()).Val() != 0 {
				t.Fatalf("after Close: err %v exists %d", l.Err(), c.Exists(ctx, l.Key()).Val())
			}
		}
	})
}

func TestRealReplicaAck(t *testing.T) {
	ctx := ctxT(t)
	// The cluster's masters each have one replica: WAIT 1 succeeds.
	cc := testenv.Cluster(t)
	m := newManager(t, cc, manager.WithReplicaAck(1, time.Second, manager.ReplicaFail), manager.WithFencing(true))
	l, err := m.TryAcquire(ctx, testenv.Unique("res"))
	if err != nil {
		t.Fatal(err)
	}
	if l.Replicas() != 1 || l.Fence() == 0 {
		t.Fatalf("replicas %d fence %d", l.Replicas(), l.Fence())
	}
	if err := l.Extend(ctx, 5*time.Second); err != nil || l.Replicas() != 1 {
		t.Fatalf("Extend = %v, replicas %d", err, l.Replicas())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The standalone server has none.
	sc := testenv.Standalone(t)
	strict := newManager(t, sc, manager.WithReplicaAck(1, 50*time.Millisecond, manager.ReplicaFail))
	res := testenv.Unique("res")
	_, err = strict.TryAcquire(ctx, res)
	var rae *manager.ReplicaAckError
	if !errors.As(err, &rae) || rae.Want != 1 || rae.Got != 0 || !errors.Is(err, manager.ErrReplicaAck) {
		t.Fatalf("TryAcquire without replicas = %v", err)
	}
	eventually(t, 5*time.Second, "unacknowledged lock released", func() bool {
		return sc.Exists(ctx, "shardlock:{"+res+"}").Val() == 0
	})
	lax := newManager(t, sc, manager.WithReplicaAck(1, 50*time.Millisecond, manager.ReplicaReport))
	l, err = lax.TryAcquire(ctx, res)
	if err != nil || l.Replicas() != 0 {
		t.Fatalf("ReplicaReport: %v, replicas %d", err, l.Replicas())
	}
	_ = l.Release(ctx)
}

// A separate client carries the renewals.
func TestRealRenewClient(t *testing.T) {
	c := testenv.Cluster(t)
	rc := testenv.Cluster(t)
	hook := &faultHook{}
	rc.AddHook(hook)
	m := newManager(t, c, manager.WithRenewClient(rc), manager.WithTTL(150*time.Millisecond))
	ctx := ctxT(t)
	l, err := m.TryAcquire(ctx, testenv.Unique("res"))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "renewals on the renew client", func() bool { return hook.seen.Load() >= 3 })
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A server stall makes an acquire time out while its SET waits in the
// server; when the stall ends the SET runs. The orphan release must free
// the key long before its TTL (10 s).
func TestRealStalledAcquireDoesNotStrandKey(t *testing.T) {
	addr := testenv.StandaloneAddr(t)
	admin := testenv.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	m := newManager(t, c, manager.WithCoalescing(false))
	ctx := ctxT(t)
	key := "shardlock:{" + testenv.Unique("stall") + "}"
	res := key[len("shardlock:{") : len(key)-1]

	stalled := make(chan error, 1)
	go func() { stalled <- admin.Do(ctx, "debug", "sleep", "1").Err() }()
	// Wait until the server is inside DEBUG SLEEP: a fresh connection's PING then times out.
	probe := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 50 * time.Millisecond, MaxRetries: -1})
	defer probe.Close()
	eventually(t, 2*time.Second, "server stalled", func() bool { return probe.Ping(ctx).Err() != nil })

	_, err := m.TryAcquire(ctx, res)
	if err == nil {
		t.Fatal("TryAcquire during a stall succeeded")
	}
	if err := <-stalled; err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	eventually(t, 3*time.Second, "stalled acquire's key released", func() bool { return admin.Exists(ctx, key).Val() == 0 })
	t.Logf("key free %v after the stall ended (TTL %v)", time.Since(start), manager.DefaultTTL)
}

// failWAIT makes every WAIT in a pipeline fail, as a connection lost after
// the write's reply would.
type failWAIT struct{}

func (failWAIT) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (failWAIT) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (failWAIT) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if c.Name() == "wait" {
				c.SetErr(errors.New("WAIT lost"))
			}
		}
		return err
	}
}

// A WAIT that fails after a successful write follows one rule, for an
// acquire and for Extend alike: no replica acknowledged, a WARN, and the
// replica policy decides.
func TestRealFailedWAITCountsNoReplica(t *testing.T) {
	ctx := ctxT(t)
	cc := testenv.Cluster(t)
	cc.OnNewNode(func(n *redis.Client) { n.AddHook(failWAIT{}) })
	_ = cc.ForEachShard(ctx, func(_ context.Context, n *redis.Client) error { n.AddHook(failWAIT{}); return nil })
	log, logs := observedLogger()
	lax := newManager(t, cc, manager.WithReplicaAck(1, time.Second, manager.ReplicaReport), manager.WithLogger(log))
	l, err := lax.TryAcquire(ctx, testenv.Unique("wait"))
	if err != nil || l.Replicas() != 0 {
		t.Fatalf("acquire with a failed WAIT: %v, replicas %d", err, l.Replicas())
	}
	if err := l.Extend(ctx, 5*time.Second); err != nil || l.Replicas() != 0 {
		t.Fatalf("Extend with a failed WAIT: %v, replicas %d", err, l.Replicas())
	}
	if n := logs.FilterField(zap.String("event", "replica_ack_failed")).Len(); n != 2 {
		t.Fatalf("%d replica_ack_failed warnings, want 2", n)
	}
	_ = l.Release(ctx)

	strict := newManager(t, cc, manager.WithReplicaAck(1, time.Second, manager.ReplicaFail))
	_, err = strict.TryAcquire(ctx, testenv.Unique("wait"))
	var rae *manager.ReplicaAckError
	if !errors.As(err, &rae) || rae.Got != 0 {
		t.Fatalf("ReplicaFail acquire with a failed WAIT: %v", err)
	}
	_, err = strict.TryAcquireBatch(ctx, []string{testenv.Unique("{w}a")})
	if !errors.As(err, &rae) || rae.Got != 0 {
		t.Fatalf("ReplicaFail batch acquire with a failed WAIT: %v", err)
	}
}
