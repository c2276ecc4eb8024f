package manager

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/sharding"
)

// Waiters on many resources share one subscription connection per node.
func TestOneSubscriptionPerNode(t *testing.T) {
	c := testenv.Cluster(t)
	m, err := New(context.Background(), c, WithRetry(LinearBackoff(5*time.Second)))
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

// A channel stays subscribed for a while after its last waiter leaves: a
// process that waits for the same lock again and again subscribes once.
func TestSubscriptionLingers(t *testing.T) {
	for _, target := range testenv.Targets() {
		if target.Name == "sentinel" {
			continue
		}
		t.Run(target.Name, func(t *testing.T) {
			c := target.Client(t)
			m, err := New(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close(context.Background())
			other, err := New(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close(context.Background())
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res := testenv.Unique("linger")
			key, _ := m.lockKey(res)
			for range 3 {
				h, err := other.TryAcquire(ctx, res)
				if err != nil {
					t.Fatal(err)
				}
				got := make(chan error, 1)
				go func() {
					l, err := m.Acquire(ctx, res)
					if err == nil {
						err = l.Release(ctx)
					}
					got <- err
				}()
				deadline := time.Now().Add(5 * time.Second)
				for c.LLen(ctx, sharding.QueueKey(key)).Val() == 0 && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
				if err := h.Release(ctx); err != nil {
					t.Fatal(err)
				}
				if err := <-got; err != nil {
					t.Fatal(err)
				}
			}
			if s, u := m.notify.subscribes.Load(), m.notify.unsubscribes.Load(); s != 1 || u != 0 {
				t.Fatalf("3 waits: %d SSUBSCRIBE, %d SUNSUBSCRIBE; want 1 and 0", s, u)
			}
			m.notify.mu.Lock()
			idle := m.notify.idle
			m.notify.mu.Unlock()
			if idle != 1 {
				t.Fatalf("%d channels linger, want 1", idle)
			}
		})
	}
}
