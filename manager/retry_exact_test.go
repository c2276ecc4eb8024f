package manager_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

// attemptHook counts the acquire attempts sent for one lock key: a SET of
// the key, or a script whose first key it is.
type attemptHook struct {
	key string
	n   atomic.Int64
}

func (h *attemptHook) count(cmd redis.Cmder) {
	args := cmd.Args()
	switch cmd.Name() {
	case "set":
		if len(args) > 1 && args[1] == h.key {
			h.n.Add(1)
		}
	case "evalsha", "eval":
		if len(args) > 3 && args[3] == h.key {
			h.n.Add(1)
		}
	}
}

func (h *attemptHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *attemptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.count(cmd); return next(ctx, cmd) }
}
func (h *attemptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.count(c)
		}
		return next(ctx, cmds)
	}
}

// A retry strategy means what it says with the fair queue on: NoRetry
// makes one attempt, LimitRetry(s, n) n attempts, and a short strategy's
// waits are not stretched. The waiter that gives up leaves no entry in
// Redis's queue.
func TestRealRetryStrategyIsExact(t *testing.T) {
	ctx := ctxT(t)
	holderClient := testenv.Standalone(t)
	holder := newManager(t, holderClient)
	for _, tt := range []struct {
		name  string
		retry manager.RetryStrategy
		want  int64
	}{
		{"NoRetry", manager.NoRetry(), 1},
		{"LimitRetry 1", manager.LimitRetry(manager.LinearBackoff(5*time.Millisecond), 1), 1},
		{"LimitRetry 2", manager.LimitRetry(manager.LinearBackoff(5*time.Millisecond), 2), 2},
		{"LimitRetry 3", manager.LimitRetry(manager.LinearBackoff(5*time.Millisecond), 3), 3},
		{"LimitRetry 5", manager.LimitRetry(manager.LinearBackoff(5*time.Millisecond), 5), 5},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := testenv.Unique("retry-exact")
			l, err := holder.TryAcquire(ctx, res)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = l.Release(ctx) }()
			h := &attemptHook{key: l.Key()}
			c := redis.NewClient(&redis.Options{Addr: testenv.StandaloneAddr(t)})
			t.Cleanup(func() { _ = c.Close() })
			c.AddHook(h)
			m := newManager(t, c)
			start := time.Now()
			_, err = m.Acquire(ctx, res, manager.AcquireWithRetry(tt.retry), manager.AcquireWithWait(10*time.Second))
			took := time.Since(start)
			if !errors.Is(err, manager.ErrNotAcquired) {
				t.Fatalf("Acquire on a held lock: %v", err)
			}
			if got := h.n.Load(); got != tt.want {
				t.Fatalf("%d attempts, want %d", got, tt.want)
			}
			// Well below the 10 s wait limit and below the 100 ms queued
			// re-check of the default strategy, for the slow machine.
			if took > 2*time.Second {
				t.Fatalf("gave up after %v", took)
			}
			t.Logf("%d attempts in %v", h.n.Load(), took)
			eventually(t, 5*time.Second, "the queue entry removed", func() bool {
				return holderClient.LLen(ctx, sharding.QueueKey(l.Key())).Val() == 0
			})
		})
	}
}
