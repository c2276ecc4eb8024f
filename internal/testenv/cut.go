package testenv

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Cutter dials a client's connections and can cut them all: after Cut,
// every connection is closed and every dial refused, so nothing more is
// sent on the client's behalf, as if its process had been killed.
type Cutter struct {
	mu    sync.Mutex
	conns []net.Conn
	cut   bool
	dials int
}

// errCut is the dial error of a cut client.
var errCut = errors.New("testenv: traffic cut")

// Dial is the client's dialer.
func (c *Cutter) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		return nil, errCut
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c.conns = append(c.conns, conn)
	c.dials++
	return conn, nil
}

// Dials returns how many connections the client has dialled.
func (c *Cutter) Dials() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dials
}

// Cut closes the client's connections and refuses new ones.
func (c *Cutter) Cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut = true
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	c.conns = nil
}

// Drop closes the client's connections and lets it dial new ones, as a
// network that resets every connection once does.
func (c *Cutter) Drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	c.conns = nil
}

// CuttableTargets returns the standalone server and the cluster, each with
// a client whose traffic a Cutter can cut; the clients are closed at
// cleanup.
func CuttableTargets() []CuttableTarget {
	return []CuttableTarget{
		{Name: "standalone", Client: func(tb testing.TB, cut *Cutter) redis.UniversalClient {
			c := redis.NewClient(&redis.Options{Addr: StandaloneAddr(tb), Dialer: cut.Dial})
			tb.Cleanup(func() { _ = c.Close() })
			ping(tb, c)
			return c
		}},
		{Name: "cluster", Client: func(tb testing.TB, cut *Cutter) redis.UniversalClient {
			return ClusterVia(tb, ClusterAddrs(tb), cut)
		}},
	}
}

// CuttableTarget is a Target whose clients dial through a Cutter.
type CuttableTarget struct {
	Name   string
	Client func(tb testing.TB, cut *Cutter) redis.UniversalClient
}

// ClusterVia returns a client of the cluster at addrs that dials through
// cut, closed at cleanup.
func ClusterVia(tb testing.TB, addrs []string, cut *Cutter) *redis.ClusterClient {
	tb.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Dialer: cut.Dial})
	tb.Cleanup(func() { _ = c.Close() })
	ping(tb, c)
	return c
}
