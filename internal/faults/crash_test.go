package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

// crashRun is one acquisition of the crash scenario.
type crashRun struct {
	key      int
	client   int
	acquired time.Time
	released time.Time // zero when the release did not succeed
}

// A client that dies (its traffic is cut: nothing more is sent on its
// behalf) while its goroutines wait for and hold contended locks: three
// clients of 8 goroutines each on 8 keys (every key contended by one
// goroutine of every client), TTL 2 s, holds of 1-20 ms, defaults
// otherwise. The dead client's queued waiters cost the others about one
// claim lease per key, and the keys it held are taken over when their TTL
// (or, handed over and not yet confirmed, their claim lease) ends, not a
// TTL after each dead waiter is handed a key. The run reports
// the longest time without an acquisition; it asserts bounds well above
// the goals and well below the TTL the fault used to cost.
func TestCrashedClient(t *testing.T) {
	const (
		clients = 3
		keys    = 8
		ttl     = 2 * time.Second
		cutAt   = 3 * time.Second
		runFor  = 7 * time.Second
	)
	addrs := testenv.FaultClusterAddrs(t)
	resources := make([]string, keys)
	for i := range resources {
		resources[i] = testenv.Unique(fmt.Sprintf("crash%d", i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), runFor)
	defer cancel()
	stop, _ := ctx.Deadline()
	cuts := make([]*testenv.Cutter, clients)
	var (
		mu   sync.Mutex
		runs []crashRun
		errs []error
		cut  time.Time
		wg   sync.WaitGroup
	)
	for ci := range clients {
		cuts[ci] = &testenv.Cutter{}
		c := testenv.ClusterVia(t, addrs, cuts[ci])
		m, err := manager.New(ctx, c, manager.WithTTL(ttl), manager.WithOwner(fmt.Sprintf("crash-%d", ci)))
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer ccancel()
			_ = m.Close(cctx)
		}()
		for k := range keys {
			wg.Go(func() {
				for ctx.Err() == nil {
					l, err := m.Acquire(ctx, resources[k])
					if err != nil {
						mu.Lock()
						if ctx.Err() == nil && ci != 0 {
							errs = append(errs, fmt.Errorf("client %d acquire: %w", ci, err))
						}
						mu.Unlock()
						return
					}
					r := crashRun{key: k, client: ci, acquired: time.Now()}
					time.Sleep(time.Millisecond + rand.N(19*time.Millisecond))
					rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
					rerr := l.Release(rctx)
					rcancel()
					if rerr == nil {
						r.released = time.Now()
					}
					mu.Lock()
					runs = append(runs, r)
					if rerr != nil && ci != 0 {
						errs = append(errs, fmt.Errorf("client %d release: %w", ci, rerr))
					}
					mu.Unlock()
				}
			})
		}
	}
	start := time.Now()
	time.Sleep(cutAt) // the scenario: the client dies after cutAt of traffic
	mu.Lock()
	cut = time.Now()
	cuts[0].Cut()
	mu.Unlock()
	wg.Wait()
	end := time.Now()
	for _, err := range errs {
		t.Error(err)
	}

	// The keys the dead client held when it died (its last acquisition of
	// a key that it did not release before the cut, even one whose grant
	// reached it just before the cut and whose Acquire returned after):
	// their TTL runs out.
	deadHeld := map[int]time.Time{}
	for _, r := range runs {
		if r.client == 0 && (r.released.IsZero() || r.released.After(cut)) && r.acquired.After(deadHeld[r.key]) {
			deadHeld[r.key] = r.acquired
		}
	}
	// Per key, the acquisitions in time order; the longest gap after the
	// cut, and the takeover of a dead holder's key after its TTL.
	var allAfter []time.Time
	worstGap, worstTakeover := time.Duration(0), time.Duration(0)
	for k := range keys {
		var times []time.Time
		for _, r := range runs {
			if r.key == k && r.client != 0 {
				times = append(times, r.acquired)
			}
		}
		slices.SortFunc(times, time.Time.Compare)
		prev := cut
		for _, at := range times {
			if at.Before(cut) {
				continue
			}
			allAfter = append(allAfter, at)
			if since, ok := deadHeld[k]; ok && prev.Equal(cut) {
				// Free again when its TTL ends, or its claim lease if
				// it was handed over and never confirmed.
				takeover := at.Sub(since)
				worstTakeover = max(worstTakeover, takeover)
				t.Logf("key %d: held by the dead client, taken over %v after it acquired it", k, takeover)
			} else {
				worstGap = max(worstGap, at.Sub(prev))
			}
			prev = at
		}
		if _, ok := deadHeld[k]; !ok {
			worstGap = max(worstGap, stop.Sub(prev)) // a key nobody took until the run stopped
		}
	}
	slices.SortFunc(allAfter, time.Time.Compare)
	worstAll, prev := time.Duration(0), cut
	for _, at := range allAfter {
		worstAll = max(worstAll, at.Sub(prev))
		prev = at
	}
	t.Logf("%d acquisitions in %v; after the cut: no key acquired by anyone for at most %v; "+
		"a key not held by the dead client went at most %v without an acquisition (claim lease %v); "+
		"%d keys held by the dead client, taken over at most %v after it acquired them (TTL %v)",
		len(runs), end.Sub(start), worstAll, worstGap, scripts.ClaimLease, len(deadHeld), worstTakeover, ttl)
	if worstAll > time.Second || worstGap > time.Second {
		t.Errorf("after the crash, %v without any acquisition, %v on one key (TTL %v)", worstAll, worstGap, ttl)
	}
	if worstTakeover > ttl+time.Second {
		t.Errorf("a dead holder's key was taken over %v after it acquired it (TTL %v)", worstTakeover, ttl)
	}
	if len(allAfter) < 100 {
		t.Errorf("only %d acquisitions after the cut", len(allAfter))
	}
}
