package manager_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/manager"
	"github.com/shardlock/shardlock/metrics"
)

// series returns the value of metric name with the given label values
// (lock_class, then reason when the metric has one); for a histogram, its
// sample count.
func series(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, mt := range mf.GetMetric() {
			for i, lp := range mt.GetLabel() {
				if i >= len(labels) || lp.GetValue() != labels[i] {
					continue next
				}
			}
			switch {
			case mt.GetCounter() != nil:
				return mt.GetCounter().GetValue()
			case mt.GetGauge() != nil:
				return mt.GetGauge().GetValue()
			case mt.GetHistogram() != nil:
				return float64(mt.GetHistogram().GetSampleCount())
			}
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

// The counters equal what a workload did: acquisitions, contention,
// timeouts, losses, releases, renewals, holds.
func TestMetricsCountTheWorkload(t *testing.T) {
	mr, c := miniClient(t)
	reg := prometheus.NewRegistry()
	mx, err := metrics.New(reg, metrics.Options{Classes: []string{"orders", "jobs"}})
	if err != nil {
		t.Fatal(err)
	}
	m := newManager(t, c, manager.WithMetrics(mx), manager.WithTTL(3*time.Second),
		manager.WithRenewInterval(20*time.Millisecond),
		manager.WithClassFunc(func(r string) string { return r[:len(r)-2] }),
		manager.WithRetry(manager.LinearBackoff(time.Millisecond)))
	ctx := ctxT(t)

	// 3 acquisitions of orders, released.
	for range 3 {
		l, err := m.TryAcquire(ctx, "orders-1")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A held jobs lock: 2 contended TryAcquires, 1 Acquire past its wait limit.
	held, err := m.TryAcquire(ctx, "jobs-1")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := m.TryAcquire(ctx, "jobs-1"); !errors.Is(err, manager.ErrNotAcquired) {
			t.Fatal(err)
		}
	}
	if _, err := m.Acquire(ctx, "jobs-1", manager.WithWait(20*time.Millisecond)); !errors.Is(err, manager.ErrNotAcquired) {
		t.Fatal(err)
	}
	if got := series(t, reg, metrics.LocksHeld, "jobs"); got != 1 {
		t.Fatalf("locks held (jobs) = %v", got)
	}
	if got := series(t, reg, metrics.OldestLockAcquiredTimestampSeconds, "jobs"); got != float64(held.AcquiredAt().UnixNano())/1e9 {
		t.Fatalf("oldest lock = %v, acquired %v", got, held.AcquiredAt())
	}
	// A renewal by Extend, then the lock is lost behind its back.
	if err := held.Extend(ctx, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	mr.Del(held.Key())
	waitDone(t, held, 2*time.Second)
	// Bad input, under the default class.
	if _, err := m.TryAcquire(ctx, ""); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatal(err)
	}
	// A class outside the allowed set.
	l, err := m.TryAcquire(ctx, "stock-1", manager.WithClass("stock"))
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Release(ctx)

	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{metrics.AcquireAttemptsTotal, []string{"orders"}, 3},
		{metrics.AcquireAttemptsTotal, []string{"jobs"}, 4},
		{metrics.AcquireFailuresTotal, []string{"jobs", metrics.ReasonContended}, 2},
		{metrics.AcquireFailuresTotal, []string{"jobs", metrics.ReasonTimeout}, 1},
		{metrics.AcquireFailuresTotal, []string{"default", metrics.ReasonInvalid}, 1},
		{metrics.AcquireFailuresTotal, []string{"orders", metrics.ReasonContended}, 0},
		{metrics.AcquireDurationSeconds, []string{"jobs"}, 4},
		{metrics.ReleasesTotal, []string{"orders"}, 3},
		{metrics.ReleaseFailuresTotal, []string{"orders", metrics.ReasonNotHeld}, 0},
		{metrics.LocksLostTotal, []string{"jobs", metrics.ReasonExpired}, 1},
		{metrics.HoldDurationSeconds, []string{"orders"}, 3},
		{metrics.HoldDurationSeconds, []string{"jobs"}, 1},
		{metrics.RenewalFailuresTotal, []string{"jobs", metrics.ReasonExpired}, 1},
		{metrics.AcquireAttemptsTotal, []string{"other"}, 1},
		{metrics.LocksHeld, []string{"jobs"}, 0},
		{metrics.LocksHeld, []string{"orders"}, 0},
		{metrics.Waiters, []string{"jobs"}, 0},
	}
	for _, c := range checks {
		if got := series(t, reg, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// Renewals: at least the Extend and the one that found the key gone.
	if got := series(t, reg, metrics.RenewalsTotal, "jobs"); got < 2 {
		t.Errorf("renewals (jobs) = %v", got)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}

// The waiters gauge counts an Acquire while it waits.
func TestMetricsWaiters(t *testing.T) {
	_, c := miniClient(t)
	reg := prometheus.NewRegistry()
	mx, _ := metrics.New(reg, metrics.Options{})
	m := newManager(t, c, manager.WithMetrics(mx), manager.WithRetry(manager.LinearBackoff(2*time.Millisecond)))
	ctx := ctxT(t)
	l, err := m.TryAcquire(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		l2, err := m.Acquire(ctx, "r")
		if err == nil {
			err = l2.Release(ctx)
		}
		done <- err
	}()
	eventually(t, 5*time.Second, "a waiter counted", func() bool { return series(t, reg, metrics.Waiters, "default") == 1 })
	_ = l.Release(ctx)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := series(t, reg, metrics.Waiters, "default"); got != 0 {
		t.Fatalf("waiters after the wait = %v", got)
	}
}

// 100,000 distinct resources, each its own class, make no more series
// than the class cap allows.
func TestMetricsCardinalityWith100kResources(t *testing.T) {
	// Redis is answered by a hook: this test is about labels, and 100,000
	// round trips to a server under -race would take a minute.
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	c.AddHook(answerHook{})
	reg := prometheus.NewRegistry()
	mx, _ := metrics.New(reg, metrics.Options{MaxClasses: 8})
	m := newManager(t, c, manager.WithMetrics(mx), manager.WithWatchdog(false), manager.WithStartupCheck(false),
		manager.WithCoalescing(false),
		manager.WithClassFunc(func(r string) string { return r })) // the worst class function
	ctx := ctxT(t)
	for i := range 100000 {
		l, err := m.TryAcquire(ctx, fmt.Sprintf("order:%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	classes := map[string]bool{}
	total := 0
	for _, mf := range mfs {
		total += len(mf.GetMetric())
		for _, mt := range mf.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == metrics.LabelClass {
					classes[lp.GetValue()] = true
				}
			}
		}
	}
	// default + 8 named + overflow.
	if len(classes) != 10 || !classes[metrics.ClassOverflow] {
		t.Fatalf("%d classes: %v", len(classes), classes)
	}
	t.Logf("100,000 resources: %d classes, %d series in all", len(classes), total)
	if got := series(t, reg, metrics.AcquireAttemptsTotal, metrics.ClassOverflow); got != 100000-8 {
		t.Fatalf("overflow attempts = %v", got)
	}
}

// answerHook answers acquire (SET ... NX GET: the key was free) and
// release (the script deleted the key) without a server.
type answerHook struct{}

func (answerHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (answerHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch c := unwrapCmd(cmd).(type) {
		case *redis.StatusCmd: // SET NX: taken
			c.SetVal("OK")
		case *redis.StringCmd:
			c.SetErr(redis.Nil)
			return redis.Nil
		case *redis.Cmd:
			c.SetVal(int64(1))
		default:
			return errors.New("answerHook: unexpected " + cmd.Name())
		}
		return nil
	}
}
func (answerHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// BenchmarkMetricsOverhead: acquire+release on the real standalone server
// with metrics on and off, from 1 and 64 goroutines.
func BenchmarkMetricsOverhead(b *testing.B) {
	c := testenv.Standalone(b)
	for _, g := range []int{1, 64} {
		for _, on := range []bool{false, true} {
			name := map[bool]string{false: "off", true: "on"}[on]
			b.Run(fmt.Sprintf("g=%d/metrics=%s", g, name), func(b *testing.B) {
				var opts []manager.Option
				if on {
					mx, err := metrics.New(prometheus.NewRegistry(), metrics.Options{})
					if err != nil {
						b.Fatal(err)
					}
					opts = append(opts, manager.WithMetrics(mx), manager.WithClassFunc(func(string) string { return "bench" }))
				}
				m := newManager(b, c, opts...)
				run := testenv.Unique("mx")
				ctx := context.Background()
				b.ReportAllocs()
				runConcurrent(b, g, func(w int) error {
					l, err := m.TryAcquire(ctx, fmt.Sprintf("%s-%d", run, w))
					if err != nil {
						return err
					}
					return l.Release(ctx)
				})
			})
		}
	}
}

// Every forced release is counted, by the class of the lock it removed.
func TestForceReleaseCounted(t *testing.T) {
	_, c := miniClient(t)
	reg := prometheus.NewRegistry()
	mx, err := metrics.New(reg, metrics.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ops := newManager(t, c, manager.WithMetrics(mx))
	worker := newManager(t, c)
	ctx := ctxT(t)
	if _, err := worker.TryAcquire(ctx, "stuck"); err != nil {
		t.Fatal(err)
	}
	if got := series(t, reg, metrics.ForceReleasesTotal, metrics.ClassDefault); got != 0 {
		t.Fatalf("before: %v", got)
	}
	if err := ops.ForceRelease(ctx, "stuck", "test"); err != nil {
		t.Fatal(err)
	}
	_ = ops.ForceRelease(ctx, "stuck", "again") // nothing left to remove: not counted
	if got := series(t, reg, metrics.ForceReleasesTotal, metrics.ClassDefault); got != 1 {
		t.Fatalf("after one forced release: %v", got)
	}
}

// A lock taken away by ForceRelease is counted under one reason, forced:
// by its holder's Release (a release failure) and by its renewal (a
// renewal failure and a loss) alike.
func TestForcedReleaseReason(t *testing.T) {
	_, c := miniClient(t)
	reg := prometheus.NewRegistry()
	mx, err := metrics.New(reg, metrics.Options{})
	if err != nil {
		t.Fatal(err)
	}
	worker := newManager(t, c, manager.WithMetrics(mx), manager.WithWatchdog(false))
	ops := newManager(t, c)
	ctx := ctxT(t)
	released, err := worker.TryAcquire(ctx, "forced-release")
	if err != nil {
		t.Fatal(err)
	}
	extended, err := worker.TryAcquire(ctx, "forced-extend")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"forced-release", "forced-extend"} {
		if err := ops.ForceRelease(ctx, r, "test"); err != nil {
			t.Fatal(err)
		}
	}
	if err := released.Release(ctx); !errors.Is(err, manager.ErrForceReleased) {
		t.Fatalf("Release = %v", err)
	}
	if err := extended.Extend(ctx, time.Minute); !errors.Is(err, manager.ErrForceReleased) {
		t.Fatalf("Extend = %v", err)
	}
	for _, c := range []struct {
		name string
		want float64
	}{
		{metrics.ReleaseFailuresTotal, 1},
		{metrics.RenewalFailuresTotal, 1},
		{metrics.LocksLostTotal, 1},
	} {
		if got := series(t, reg, c.name, metrics.ClassDefault, metrics.ReasonForced); got != c.want {
			t.Errorf("%s{reason=forced} = %v, want %v", c.name, got, c.want)
		}
	}
	for _, s := range [][2]string{{metrics.ReleaseFailuresTotal, metrics.ReasonRedisError}, {metrics.ReleaseFailuresTotal, metrics.ReasonNotHeld},
		{metrics.RenewalFailuresTotal, metrics.ReasonNotHeld}, {metrics.LocksLostTotal, metrics.ReasonNotHeld}} {
		if got := series(t, reg, s[0], metrics.ClassDefault, s[1]); got != 0 {
			t.Errorf("%s{reason=%s} = %v, want 0", s[0], s[1], got)
		}
	}
}
