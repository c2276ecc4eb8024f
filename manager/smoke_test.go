package manager_test

import (
	"errors"
	"testing"

	"github.com/shardlock/shardlock/manager"
)

func TestSmokeMiniredis(t *testing.T) {
	_, c := miniClient(t)
	m := newManager(t, c)
	ctx := ctxT(t)
	l, err := m.TryAcquire(ctx, "order:1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryAcquire(ctx, "order:1"); !errors.Is(err, manager.ErrNotAcquired) {
		t.Fatalf("second acquire: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := m.TryAcquire(ctx, "order:1", manager.AcquireWithFencing())
	if err != nil || l2.Fence() != 1 {
		t.Fatal(err, l2.Fence())
	}
}
