// Package slotmap reads which master serves which hash slots of a Redis
// Cluster, from CLUSTER SHARDS, for the exporter's probes and the tests.
package slotmap

import (
	"context"
	"net"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Range is a range of slots, the master that serves it and its replicas
// (addresses as host:port).
type Range struct {
	Start, End int
	Master     string
	Replicas   []string
}

// Map is a cluster's slot ranges.
type Map []Range

// Sharder is a client that can send CLUSTER SHARDS: a cluster client or a
// client of one of its nodes.
type Sharder interface {
	ClusterShards(ctx context.Context) *redis.ClusterShardsCmd
}

// Read returns the slot map c's cluster reports. A shard's master is its
// online master (after a failover, the one that took over).
func Read(ctx context.Context, c Sharder) (Map, error) {
	shards, err := c.ClusterShards(ctx).Result()
	if err != nil {
		return nil, err
	}
	var m Map
	for _, sh := range shards {
		var master string
		var replicas []string
		for _, n := range sh.Nodes {
			addr := net.JoinHostPort(host(n), strconv.FormatInt(n.Port, 10))
			switch {
			case n.Role == "master" && (master == "" || n.Health == "online"):
				master = addr
			case n.Role != "master" && n.Health == "online":
				replicas = append(replicas, addr)
			}
		}
		for _, r := range sh.Slots {
			m = append(m, Range{Start: int(r.Start), End: int(r.End), Master: master, Replicas: replicas})
		}
	}
	return m, nil
}

func host(n redis.Node) string {
	if n.IP != "" {
		return n.IP
	}
	return n.Endpoint
}

// Of returns the range that holds slot, and whether there is one.
func (m Map) Of(slot int) (Range, bool) {
	for _, r := range m {
		if slot >= r.Start && slot <= r.End {
			return r, true
		}
	}
	return Range{}, false
}

// Masters returns the masters' addresses, each once.
func (m Map) Masters() []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range m {
		if r.Master != "" && !seen[r.Master] {
			seen[r.Master] = true
			out = append(out, r.Master)
		}
	}
	return out
}
