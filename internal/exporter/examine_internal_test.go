package exporter

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/sharding"
)

// A key whose slot left a node between SCAN and GET (the node answers it
// with a redirect) is counted where it is now, not skipped as unreadable
// on the node the scan found it on. Reading a key on a master that does
// not serve its slot gets the same MOVED reply.
func TestExamineSkipsKeysThatMoved(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := testenv.Cluster(t)
	key, _ := sharding.LockKey(sharding.DefaultPrefix, testenv.Unique("moved"))
	if err := c.Set(ctx, key, "sl1.1.AAAAAAAAAAAAAAAAAAAAAA.owner", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	_, elsewhere := testenv.MastersOf(t, ctx, c, key)
	e, err := New(c, Config{Prefix: sharding.DefaultPrefix})
	if err != nil {
		t.Fatal(err)
	}
	res := &ScanResult{Classes: map[string]*ClassStats{}, Masters: map[string]MasterStats{}, Skipped: map[string]int{}}
	var mu sync.Mutex
	if err := e.examine(ctx, elsewhere, []string{key}, res, &mu, newClassBounder(10), time.Now()); err != nil {
		t.Fatal(err)
	}
	if len(res.Skipped) != 0 || len(res.Classes) != 0 {
		t.Fatalf("a key read on a node its slot left: skipped %v, classes %v; want neither", res.Skipped, res.Classes)
	}
}
