package slotmap_test

import (
	"context"
	"testing"
	"time"

	"github.com/shardlock/shardlock/internal/slotmap"
	"github.com/shardlock/shardlock/internal/testenv"
)

// The test cluster's 16384 slots are served by 3 masters with a replica
// each, and the map agrees with the client's own routing.
func TestReadCluster(t *testing.T) {
	c := testenv.Cluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := slotmap.Read(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	covered := 0
	for _, r := range m {
		covered += r.End - r.Start + 1
		if r.Master == "" || len(r.Replicas) != 1 {
			t.Errorf("range %d-%d: master %q, replicas %v", r.Start, r.End, r.Master, r.Replicas)
		}
	}
	if covered != 16384 || len(m.Masters()) != 3 {
		t.Fatalf("%d slots covered by %d masters", covered, len(m.Masters()))
	}
	for _, key := range []string{"a", "b", "{x}y", "zz"} {
		n, err := c.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		slot := int(c.ClusterKeySlot(ctx, key).Val())
		if r, ok := m.Of(slot); !ok || r.Master != n.Options().Addr {
			t.Errorf("key %q (slot %d): map says %q, the client routes to %s", key, slot, r.Master, n.Options().Addr)
		}
	}
}
