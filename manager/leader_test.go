package manager_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// Four managers campaign for one election in turn: one leader at a time,
// terms rising with every leader, and an observer sees the leaders in the
// order of their terms.
func TestRealElectionOneLeaderAtATime(t *testing.T) {
	c := testenv.Cluster(t)
	ctx := ctxT(t)
	name := testenv.Unique("election")
	var ms []*manager.Manager
	for i := range 4 {
		ms = append(ms, newManager(t, testenv.Cluster(t), manager.WithOwner(fmt.Sprintf("node-%d", i))))
	}
	watcher := newManager(t, c)
	octx, stopObserving := context.WithCancel(ctx)
	seen, err := watcher.Observe(octx, name)
	if err != nil {
		t.Fatal(err)
	}
	var observed []uint64
	observing := make(chan struct{})
	go func() {
		defer close(observing)
		for info := range seen {
			if info.Term != 0 {
				observed = append(observed, info.Term)
			}
		}
	}()
	var (
		leading atomic.Int32
		mu      sync.Mutex
		terms   []uint64
		wg      sync.WaitGroup
	)
	for _, m := range ms {
		wg.Go(func() {
			for range 5 {
				ld, err := m.Campaign(ctx, name)
				if err != nil {
					t.Error(err)
					return
				}
				if n := leading.Add(1); n != 1 {
					t.Errorf("%d leaders at once", n)
				}
				mu.Lock()
				terms = append(terms, ld.Term())
				mu.Unlock()
				time.Sleep(60 * time.Millisecond) // lead a while: longer than the observer's period
				leading.Add(-1)
				if err := ld.Resign(ctx); err != nil {
					t.Error(err)
				}
				select {
				case <-ld.Done():
				default:
					t.Error("Done open after Resign")
				}
			}
		})
	}
	wg.Wait()
	if len(terms) != 20 {
		t.Fatalf("%d leaderships, want 20", len(terms))
	}
	for i := 1; i < len(terms); i++ {
		if terms[i] <= terms[i-1] {
			t.Fatalf("terms %v: want them rising", terms)
		}
	}
	// The observer saw the leaders in order of their terms.
	eventually(t, 5*time.Second, "the observer sees nobody lead", func() bool {
		info, err := watcher.Leader(ctx, name)
		return errors.Is(err, manager.ErrNoLeader) && info == (manager.LeaderInfo{})
	})
	stopObserving()
	<-observing // the channel is closed once ctx ends
	if !slices.IsSorted(observed) || len(observed) < 10 {
		t.Fatalf("observed terms %v (of %d leaderships)", observed, len(terms))
	}
	t.Logf("20 leaderships, terms rising; the observer saw %d of them, in order", len(observed))
}

// A leader whose process dies (its traffic cut) is replaced within its TTL
// and the hand-over; the dead leader's Done closes when its validity runs
// out.
func TestRealElectionDeadLeaderReplaced(t *testing.T) {
	ctx := ctxT(t)
	const ttl = time.Second
	name := testenv.Unique("election")
	cut := &testenv.Cutter{}
	dead := newManager(t, testenv.ClusterVia(t, testenv.ClusterAddrs(t), cut), manager.WithOwner("dead"), manager.WithTTL(ttl))
	live := newManager(t, testenv.Cluster(t), manager.WithOwner("live"), manager.WithTTL(ttl))
	old, err := dead.Campaign(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := live.Leader(ctx, name)
	if err != nil || info.Owner != "dead" || info.Term != old.Term() {
		t.Fatalf("Leader = %+v, %v; want dead at term %d", info, err, old.Term())
	}
	got := make(chan *manager.Leadership, 1)
	go func() {
		ld, err := live.Campaign(ctx, name)
		if err != nil {
			t.Error(err)
		}
		got <- ld
	}()
	cutAt := time.Now()
	cut.Cut()
	ld := <-got
	if ld == nil {
		t.FailNow()
	}
	took := time.Since(cutAt)
	t.Logf("the dead leader was replaced %v after its traffic was cut (TTL %v)", took, ttl)
	if took > ttl+time.Second {
		t.Fatalf("replaced after %v", took)
	}
	if ld.Term() <= old.Term() {
		t.Fatalf("new term %d after %d", ld.Term(), old.Term())
	}
	select {
	case <-old.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the dead leader's Done stayed open")
	}
	_ = ld.Resign(ctx)
}

// Bad election names are refused before any round trip, and an election
// nobody leads says so.
func TestElectionInput(t *testing.T) {
	_, c := miniClient(t)
	m := newManager(t, c)
	ctx := ctxT(t)
	var ia *manager.InvalidArgumentError
	if _, err := m.Campaign(ctx, ""); !errors.As(err, &ia) {
		t.Fatalf("Campaign(\"\") = %v", err)
	}
	if _, err := m.Observe(ctx, ""); !errors.As(err, &ia) {
		t.Fatalf("Observe(\"\") = %v", err)
	}
	if _, err := m.Leader(ctx, string(make([]byte, 2000))); !errors.As(err, &ia) {
		t.Fatalf("Leader(too long) = %v", err)
	}
	if _, err := m.Leader(ctx, "nobody"); !errors.Is(err, manager.ErrNoLeader) {
		t.Fatalf("Leader of an empty election = %v", err)
	}
}
