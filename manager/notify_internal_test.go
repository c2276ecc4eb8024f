package manager

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardlock/shardlock/internal/testenv"
)

// Waiters on many resources share one subscription connection per node.
func TestOneSubscriptionPerNode(t *testing.T) {
	c := testenv.Cluster(t)
	m, err := New(c, WithRetry(LinearBackoff(5*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	prefix := testenv.Unique("sub")
	done := make(chan struct{}, 30)
	for i := range 30 {
		res := fmt.Sprintf("%s-%d", prefix, i)
		if _, err := m.TryAcquire(ctx, res); err != nil {
			t.Fatal(err)
		}
		go func() {
			_, _ = m.Acquire(ctx, res)
			done <- struct{}{}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		m.notify.mu.Lock()
		chans, nodes := len(m.notify.chans), len(m.notify.nodes)
		m.notify.mu.Unlock()
		if chans == 30 {
			if nodes > 3 {
				t.Fatalf("%d subscription connections for 3 masters", nodes)
			}
			t.Logf("30 waiters on 30 resources: %d subscription connections", nodes)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d channels watched", chans)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	for range 30 {
		<-done
	}
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}
