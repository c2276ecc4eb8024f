package manager

import (
	"context"
	"testing"
	"time"

	"github.com/shardlock/shardlock/internal/testenv"
)

// A lock whose slot left a node between List's SCAN and its reads (the
// node answers with a redirect) is listed where it is now, not as a
// foreign value held on the node the walk found it on. Reading a key on a
// master that does not serve its slot gets the same MOVED reply.
func TestListSkipsLocksThatMoved(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := testenv.Cluster(t)
	m, err := New(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Close(context.Background()) }()
	l, err := m.TryAcquire(ctx, testenv.Unique("listmoved"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(context.Background()) }()
	serving, elsewhere := testenv.MastersOf(t, ctx, c, l.Key())
	infos, err := m.readLocks(ctx, elsewhere, []string{l.Key()}, ListOptions{})
	if err != nil || len(infos) != 0 {
		t.Fatalf("a lock read on a node its slot left: %+v, %v; want nothing", infos, err)
	}
	infos, err = m.readLocks(ctx, serving, []string{l.Key()}, ListOptions{})
	if err != nil || len(infos) != 1 || !infos[0].Held || infos[0].Foreign {
		t.Fatalf("the lock read where it is: %+v, %v; want it held", infos, err)
	}
}
