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

// rwSection is one critical section under a read-write lock.
type rwSection struct {
	section
	write bool
}

// TestRealRWExclusionStress: 6 managers, each with its own cluster client,
// 8 goroutines each, take 2 read-write locks for 4 s as readers (3 in 4)
// and writers, with 1 s TTLs (short, yet past the pauses a busy 2-core
// machine under -race gives a process: a holder paused past its TTL loses
// its lock, as it should, which this test would count as a failure) and
// the watchdog on, waiting through the
// fair queue and, in a second run, by polling. A writer does a non-atomic
// read-modify-write of a counter in Redis; a reader reads it at the start
// and the end of its section, and the two reads must agree. No writer's
// section may overlap any other section of its lock, writers' fences must
// rise in acquisition order, the counter must equal the number of writers'
// sections, and readers must have shared the lock (some of their sections
// overlap), or the test tested nothing.
func TestRealRWExclusionStress(t *testing.T) {
	if testing.Short() {
		t.Skip("stress test")
	}
	for _, mode := range []struct {
		name string
		opts []manager.Option
	}{
		{"fair", nil},
		{"polling", []manager.Option{manager.WithNotifications(false)}},
	} {
		t.Run(mode.name, func(t *testing.T) { rwStress(t, mode.opts) })
	}
}

func rwStress(t *testing.T, extra []manager.Option) {
	addrs := testenv.ClusterAddrs(t)
	const (
		managers  = 6
		workers   = 8
		resources = 2
		runFor    = 4 * time.Second
	)
	run := testenv.Unique("rwstress")
	admin := testenv.Cluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), runFor)
	defer cancel()
	bg := ctxT(t)

	var (
		mu       sync.Mutex
		sections []rwSection
		wg       sync.WaitGroup
		errs     = make(chan error, 100)
	)
	// report keeps the first errors; a broken lock makes many.
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	for i := range managers {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		opts := append([]manager.Option{manager.WithTTL(time.Second), manager.WithFencing(true),
			manager.WithOwner(fmt.Sprintf("rwstress-%d", i)),
			manager.WithRetry(manager.ExponentialBackoff(time.Millisecond, 20*time.Millisecond))}, extra...)
		m := newManager(t, c, opts...)
		for range workers {
			wg.Go(func() {
				for ctx.Err() == nil {
					r := rand.IntN(resources)
					res := fmt.Sprintf("{%s-%d}", run, r)
					write := rand.IntN(4) == 0
					acquire := m.AcquireRead
					if write {
						acquire = m.AcquireWrite
					}
					l, err := acquire(ctx, res)
					if err != nil {
						if ctx.Err() != nil && errors.Is(err, manager.ErrNotAcquired) {
							return
						}
						report(fmt.Errorf("acquire (write %v): %w", write, err))
						return
					}
					s := rwSection{section: section{resource: r, fence: l.Fence(), start: time.Now()}, write: write}
					counter := res + ":counter"
					v, err := admin.Get(bg, counter).Int()
					if err != nil && !errors.Is(err, redis.Nil) {
						report(err)
					}
					time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
					if write {
						if err := admin.Set(bg, counter, v+1, 0).Err(); err != nil {
							report(err)
						}
					} else if v2, _ := admin.Get(bg, counter).Int(); v2 != v {
						report(fmt.Errorf("resource %d: a writer ran inside a reader's section: counter %d, then %d", r, v, v2))
					}
					s.end = time.Now()
					if l.Err() != nil {
						report(fmt.Errorf("lock lost inside its critical section: %w", l.Err()))
					}
					if err := l.Release(bg); err != nil {
						report(fmt.Errorf("release (write %v): %w", write, err))
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
	perResource := make([][]rwSection, resources)
	for _, s := range sections {
		perResource[s.resource] = append(perResource[s.resource], s)
	}
	var reads, writes, shared int
	for r, ss := range perResource {
		counter := fmt.Sprintf("{%s-%d}:counter", run, r)
		got, _ := admin.Get(bg, counter).Int()
		errs, n := checkRWSections(ss, got)
		for _, err := range errs {
			t.Errorf("resource %d: %v", r, err)
		}
		shared += n
		for _, s := range ss {
			if s.write {
				writes++
			} else {
				reads++
			}
		}
		admin.Del(bg, counter, fmt.Sprintf("shardlock:{%s-%d}:fence", run, r))
	}
	t.Logf("%d reader and %d writer sections over %d locks by %d goroutines in %v; %d readers overlapped another", reads, writes, resources, managers*workers, runFor, shared)
	if writes < 20 || reads < 60 {
		t.Fatalf("only %d writer and %d reader sections: the stress did not stress", writes, reads)
	}
	if shared == 0 {
		t.Fatal("no two readers ever shared a lock")
	}
}

// checkRWSections checks the sections of one read-write lock: no writer's
// overlaps another section, writers' fences rise in acquisition order, the
// counter equals the writers' sections. It also counts the readers'
// sections that overlap an earlier reader's.
func checkRWSections(ss []rwSection, counter int) (errs []error, shared int) {
	ss = slices.Clone(ss)
	slices.SortFunc(ss, func(a, b rwSection) int { return a.start.Compare(b.start) })
	var writes []section
	for _, s := range ss {
		if s.write {
			writes = append(writes, s.section)
		}
	}
	errs = checkSections(writes, counter, true)
	var lastEnd time.Time // the latest end of the sections so far
	lastWasWrite := false
	for i, s := range ss {
		if i > 0 && s.start.Before(lastEnd) {
			if s.write || lastWasWrite {
				errs = append(errs, fmt.Errorf("a writer's section overlaps another: %v-%v (write %v) starts before %v", s.start, s.end, s.write, lastEnd))
			} else {
				shared++
			}
		}
		if s.end.After(lastEnd) {
			lastEnd, lastWasWrite = s.end, s.write
		}
	}
	return errs, shared
}
