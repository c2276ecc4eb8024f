package transport

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// topology is the one place that knows which kind of deployment the
// client talks to: one server (a *redis.Client, standalone or
// through Sentinel failover) or a cluster (a *redis.ClusterClient). New
// rejects any other client: the fair queue's notifications, the replica
// acknowledgement and the coalescer need to reach the master that serves a
// key.
type topology struct {
	cc  *redis.ClusterClient // the cluster, or nil
	one *redis.Client        // the one server, or nil

	lastReload atomic.Int64 // unix ns of the last slot map reload
}

func newTopology(c redis.UniversalClient) (*topology, error) {
	switch c := c.(type) {
	case *redis.ClusterClient:
		return &topology{cc: c}, nil
	case *redis.Client:
		return &topology{one: c}, nil
	}
	return nil, fmt.Errorf("%T is not supported: use a *redis.Client (standalone, or Sentinel failover) or a *redis.ClusterClient", c)
}

// MasterFor returns the client of the master that serves key.
func (t *topology) MasterFor(ctx context.Context, key string) (*redis.Client, error) {
	if t.cc != nil {
		return t.cc.MasterForKey(ctx, key)
	}
	return t.one, nil
}

// EachMaster runs fn on every master, concurrently on a cluster.
func (t *topology) EachMaster(ctx context.Context, fn func(context.Context, *redis.Client) error) error {
	if t.cc != nil {
		return t.cc.ForEachMaster(ctx, fn)
	}
	return fn(ctx, t.one)
}

// Reload makes a cluster client re-read the slot map, at most once per
// 100 ms.
func (t *topology) Reload(ctx context.Context) {
	if t.cc == nil {
		return
	}
	now := time.Now().UnixNano()
	last := t.lastReload.Load()
	if now-last < int64(100*time.Millisecond) || !t.lastReload.CompareAndSwap(last, now) {
		return
	}
	t.cc.ReloadState(ctx)
}

// Masters returns the client of every master (one server: its client).
func (t *topology) Masters(ctx context.Context) ([]*redis.Client, error) {
	if t.cc == nil {
		return []*redis.Client{t.one}, nil
	}
	var mu sync.Mutex
	var out []*redis.Client
	err := t.cc.ForEachMaster(ctx, func(_ context.Context, n *redis.Client) error {
		mu.Lock()
		out = append(out, n)
		mu.Unlock()
		return nil
	})
	return out, err
}

// Cluster returns the cluster client, or nil for one server.
func (t *topology) Cluster() *redis.ClusterClient { return t.cc }
