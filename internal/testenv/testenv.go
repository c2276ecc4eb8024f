// Package testenv connects shardlock's tests to the real Redis servers that
// scripts/redis-test-env.sh starts.
//
// The servers are found through environment variables:
//
//	SHARDLOCK_REDIS_ADDR      a standalone server, host:port
//	SHARDLOCK_SENTINEL_ADDR   a Sentinel watching the standalone server as master "shardlock"
//	SHARDLOCK_CLUSTER_ADDRS   comma-separated seed addresses of a cluster
//	SHARDLOCK_REQUIRE_REDIS   when "1", a missing server fails the test
//
// Without SHARDLOCK_REQUIRE_REDIS a test that needs a missing server is
// skipped, so `go test ./...` works on a laptop with no Redis; CI sets it, so
// there a missing server is a failure, never a silent skip.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Required reports whether a missing server must fail the test.
func Required() bool { return os.Getenv("SHARDLOCK_REQUIRE_REDIS") == "1" }

func missing(tb testing.TB, what string) {
	tb.Helper()
	if Required() {
		tb.Fatalf("%s is not set but SHARDLOCK_REQUIRE_REDIS=1: start the servers with scripts/redis-test-env.sh up", what)
	}
	tb.Skipf("%s is not set: run scripts/redis-test-env.sh up and source .redis-test/env", what)
}

// env returns the variable name, or skips/fails when it is not set.
func env(tb testing.TB, name string) string {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		missing(tb, name)
	}
	return v
}

// StandaloneAddr returns the standalone server's address, or skips/fails.
func StandaloneAddr(tb testing.TB) string {
	tb.Helper()
	return env(tb, "SHARDLOCK_REDIS_ADDR")
}

// ClusterAddrs returns the cluster's seed addresses, or skips/fails.
func ClusterAddrs(tb testing.TB) []string {
	tb.Helper()
	return strings.Split(env(tb, "SHARDLOCK_CLUSTER_ADDRS"), ",")
}

// Sentinel returns a failover client that finds the master "shardlock"
// through the Sentinel, closed at cleanup.
func Sentinel(tb testing.TB) *redis.Client {
	tb.Helper()
	addr := env(tb, "SHARDLOCK_SENTINEL_ADDR")
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "shardlock", SentinelAddrs: []string{addr}})
	tb.Cleanup(func() { _ = c.Close() })
	ping(tb, c)
	return c
}

// FaultClusterAddrs returns the seed addresses of the cluster that only the
// fault tests use (they kill, fail over and migrate), or skips/fails.
func FaultClusterAddrs(tb testing.TB) []string {
	tb.Helper()
	return strings.Split(env(tb, "SHARDLOCK_FAULT_CLUSTER_ADDRS"), ",")
}

// DataDir returns the directory of the test servers (pid files, configs).
func DataDir(tb testing.TB) string {
	tb.Helper()
	return env(tb, "SHARDLOCK_TEST_DIR")
}

// Standalone returns a client of the standalone server, closed at cleanup.
func Standalone(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: StandaloneAddr(tb)})
	tb.Cleanup(func() { _ = c.Close() })
	ping(tb, c)
	return c
}

// Cluster returns a client of the cluster, closed at cleanup.
func Cluster(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: ClusterAddrs(tb)})
	tb.Cleanup(func() { _ = c.Close() })
	ping(tb, c)
	return c
}

// MastersOf returns the client of the master of c that serves key and of
// one that does not (whose replies to key's commands are MOVED), failing
// the test if c has no such pair.
func MastersOf(tb testing.TB, ctx context.Context, c *redis.ClusterClient, key string) (serving, other *redis.Client) {
	tb.Helper()
	serving, err := c.MasterForKey(ctx, key)
	if err != nil {
		tb.Fatal(err)
	}
	var mu sync.Mutex
	_ = c.ForEachMaster(ctx, func(_ context.Context, n *redis.Client) error { // concurrently
		mu.Lock()
		defer mu.Unlock()
		if n.Options().Addr != serving.Options().Addr {
			other = n
		}
		return nil
	})
	if other == nil {
		tb.Fatalf("no master without the slot of %s", key)
	}
	return serving, other
}

// Target is one real server setup a behaviour test runs against.
type Target struct {
	Name   string
	Client func(tb testing.TB) redis.UniversalClient
}

// Targets returns the standalone server (directly and through Sentinel) and
// the cluster, for tests that must hold on each.
func Targets() []Target {
	return []Target{
		{Name: "standalone", Client: func(tb testing.TB) redis.UniversalClient { return Standalone(tb) }},
		{Name: "sentinel", Client: func(tb testing.TB) redis.UniversalClient { return Sentinel(tb) }},
		{Name: "cluster", Client: func(tb testing.TB) redis.UniversalClient { return Cluster(tb) }},
	}
}

func ping(tb testing.TB, c redis.UniversalClient) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		tb.Fatalf("ping %v: %v", c, err)
	}
}

// Unique returns name followed by random hex, so tests that share a server
// never share keys.
func Unique(name string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return name + "-" + hex.EncodeToString(b[:])
}
