package manager_test

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

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
	m, err := manager.New(c, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = m.Close(ctx)
	})
	return m
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
