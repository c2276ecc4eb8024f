package manager_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
)

type section struct {
	resource   int
	fence      uint64
	start, end time.Time // one monotonic clock: every manager is in this process
}

// TestRealMutualExclusionStress: 8 managers, each with its own cluster
// client, 8 goroutines each, contend for 4 resources for 4 s with 1 s
// TTLs (see TestRealRWExclusionStress) and the watchdog on. Every critical section does a non-atomic
// read-modify-write of a counter in Redis and records its interval. The
// counters must equal the number of sections, no two sections on one
// resource may overlap, and with fencing fences must rise in acquisition
// order. Without fencing, locks are also handed over within a process
// without a round trip (the next holder takes over the token).
func TestRealMutualExclusionStress(t *testing.T) {
	if testing.Short() {
		t.Skip("stress test")
	}
	for _, fencing := range []bool{true, false} {
		t.Run(fmt.Sprintf("fencing=%v", fencing), func(t *testing.T) { mutualExclusionStress(t, fencing, false) })
	}
	// Half the Managers with the scripts only: on Valkey the others hand
	// the lock over in the conditional commands, on the same queue.
	t.Run("mixed", func(t *testing.T) { mutualExclusionStress(t, false, true) })
}

func mutualExclusionStress(t *testing.T, fencing, mixed bool) {
	addrs := testenv.ClusterAddrs(t)
	const (
		managers  = 8
		workers   = 8
		resources = 4
		runFor    = 4 * time.Second
	)
	run := testenv.Unique("stress")
	admin := testenv.Cluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), runFor)
	defer cancel()
	bg := ctxT(t)

	var (
		mu       sync.Mutex
		sections []section
		wg       sync.WaitGroup
		errs     = make(chan error, managers*workers)
	)
	for i := range managers {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { _ = c.Close() })
		m := newManager(t, c, manager.WithTTL(time.Second), manager.WithFencing(fencing),
			manager.WithOwner(fmt.Sprintf("stress-%d", i)),
			manager.WithRetry(manager.ExponentialBackoff(time.Millisecond, 20*time.Millisecond)),
			manager.WithConditionalCommands(!mixed || i%2 == 0))
		for range workers {
			wg.Go(func() {
				for ctx.Err() == nil {
					r := rand.IntN(resources)
					res := fmt.Sprintf("{%s-%d}", run, r)
					l, err := m.Acquire(ctx, res)
					if err != nil {
						if ctx.Err() != nil && errors.Is(err, manager.ErrNotAcquired) {
							return
						}
						errs <- fmt.Errorf("acquire: %w", err)
						return
					}
					s := section{resource: r, fence: l.Fence(), start: time.Now()}
					counter := res + ":counter"
					v, err := c.Get(bg, counter).Int()
					if err != nil && !errors.Is(err, redis.Nil) {
						errs <- err
					}
					time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
					if err := c.Set(bg, counter, v+1, 0).Err(); err != nil {
						errs <- err
					}
					s.end = time.Now()
					if l.Err() != nil {
						errs <- fmt.Errorf("lock lost inside its critical section: %w", l.Err())
					}
					if err := l.Release(bg); err != nil {
						errs <- fmt.Errorf("release: %w", err)
					}
					mu.Lock()
					sections = append(sections, s)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	perResource := make([][]section, resources)
	for _, s := range sections {
		perResource[s.resource] = append(perResource[s.resource], s)
	}
	for r, ss := range perResource {
		counter := fmt.Sprintf("{%s-%d}:counter", run, r)
		got, _ := admin.Get(bg, counter).Int()
		for _, err := range checkSections(ss, got, fencing) {
			t.Errorf("resource %d: %v", r, err)
		}
		admin.Del(bg, counter, fmt.Sprintf("shardlock:{%s-%d}:fence", run, r))
	}
	t.Logf("%d critical sections over %d resources by %d goroutines in %v", len(sections), resources, managers*workers, runFor)
	if len(sections) < 100 {
		t.Fatalf("only %d critical sections: the stress did not stress", len(sections))
	}
}

// checkSections checks the critical sections of one resource: the counter
// equals their number, no two overlap, fences (if fenced) rise in
// acquisition order.
func checkSections(ss []section, counter int, fenced bool) []error {
	var errs []error
	if counter != len(ss) {
		errs = append(errs, fmt.Errorf("counter %d, %d critical sections (lost updates)", counter, len(ss)))
	}
	ss = slices.Clone(ss)
	slices.SortFunc(ss, func(a, b section) int { return a.start.Compare(b.start) })
	for i := 1; i < len(ss); i++ {
		if ss[i].start.Before(ss[i-1].end) {
			errs = append(errs, fmt.Errorf("sections overlap: %v-%v and %v-%v", ss[i-1].start, ss[i-1].end, ss[i].start, ss[i].end))
		}
		if fenced && ss[i].fence <= ss[i-1].fence {
			errs = append(errs, fmt.Errorf("fence %d after %d", ss[i].fence, ss[i-1].fence))
		}
	}
	return errs
}

// The checker must catch what it is there to catch (a negative control).
func TestCheckSectionsCatchesViolations(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	good := []section{{fence: 1, start: at(0), end: at(10)}, {fence: 2, start: at(10), end: at(20)}}
	if errs := checkSections(good, 2, true); len(errs) != 0 {
		t.Fatalf("clean history flagged: %v", errs)
	}
	tests := []struct {
		name    string
		give    []section
		counter int
	}{
		{"lost update", good, 1},
		{"overlap", []section{{fence: 1, start: at(0), end: at(10)}, {fence: 2, start: at(5), end: at(20)}}, 2},
		{"fence not rising", []section{{fence: 2, start: at(0), end: at(10)}, {fence: 2, start: at(10), end: at(20)}}, 2},
	}
	for _, tt := range tests {
		if errs := checkSections(tt.give, tt.counter, true); len(errs) == 0 {
			t.Errorf("%s: not caught", tt.name)
		}
	}
}
