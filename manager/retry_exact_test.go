package manager_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/sharding"
)

// attemptHook counts the acquire attempts sent for one lock key: a SET of
// the key, or a script whose first key it is.
func attemptHook(key string) *matchHook {
	return &matchHook{match: func(cmd redis.Cmder) bool {
		args := cmd.Args()
		switch cmd.Name() {
		case "set":
			return len(args) > 1 && args[1] == key
		case "evalsha", "eval":
			return len(args) > 3 && args[3] == key
		}
		return false
	}}
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
			h := attemptHook(l.Key())
			c := redis.NewClient(&redis.Options{Addr: testenv.StandaloneAddr(t)})
			t.Cleanup(func() { _ = c.Close() })
			c.AddHook(h)
			m := newManager(t, c)
			start := time.Now()
			_, err = m.Acquire(ctx, res, manager.WithRetry(tt.retry), manager.WithWait(10*time.Second))
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
