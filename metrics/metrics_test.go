package metrics_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/shardlock/shardlock/metrics"
)

func newMetrics(t *testing.T, opts metrics.Options) (*metrics.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, opts)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

func TestLintClean(t *testing.T) {
	m, reg := newMetrics(t, metrics.Options{})
	c := m.Class("orders")
	c.Acquired(time.Millisecond)
	c.AcquireFailed(time.Second, metrics.ReasonTimeout)
	c.Released(time.Second, "")
	c.Renewed(metrics.ReasonRedisError)
	c.Lost(time.Minute, metrics.ReasonNotHeld)
	c.Waiting(1)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	// Only the catalogue's labels, and never a key, resource or token.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := metrics.Names(metrics.Library)
	for _, mf := range mfs {
		if !names[mf.GetName()] {
			t.Errorf("%s is not in the catalogue", mf.GetName())
		}
		for _, mt := range mf.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if n := lp.GetName(); n != metrics.LabelClass && n != metrics.LabelReason && n != "le" {
					t.Errorf("%s has label %q", mf.GetName(), n)
				}
			}
		}
	}
}

// classes returns the distinct lock_class values of metric name.
func classes(t *testing.T, reg *prometheus.Registry, name string) map[string]bool {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			out[label(mt, metrics.LabelClass)] = true
		}
	}
	return out
}

func label(mt *dto.Metric, name string) string {
	for _, lp := range mt.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

func TestClassCardinalityIsBounded(t *testing.T) {
	m, reg := newMetrics(t, metrics.Options{MaxClasses: 5})
	for i := range 100000 {
		m.Class(fmt.Sprintf("resource-%d", i)).Acquired(time.Millisecond)
	}
	got := classes(t, reg, metrics.AcquireAttemptsTotal)
	if len(got) != 5+2 || !got[metrics.ClassOverflow] || !got[metrics.ClassDefault] {
		t.Fatalf("classes after 100,000 names: %d %v", len(got), got)
	}
	if v := testutil.ToFloat64(m.Class("resource-99999").AcquiredCounterForTest()); v != 100000-5 {
		t.Fatalf("overflow attempts = %v", v)
	}
}

func TestAllowedClasses(t *testing.T) {
	m, reg := newMetrics(t, metrics.Options{Classes: []string{"orders", "payments"}})
	for _, name := range []string{"orders", "payments", "stock", "", "bad\nname"} {
		m.Class(name).Acquired(time.Millisecond)
	}
	got := classes(t, reg, metrics.AcquireAttemptsTotal)
	want := []string{"orders", "payments", metrics.ClassOther, metrics.ClassDefault}
	if len(got) != len(want) {
		t.Fatalf("classes %v, want %v", got, want)
	}
	for _, w := range want {
		if !got[w] {
			t.Fatalf("classes %v lack %q", got, w)
		}
	}
}

func TestNewErrors(t *testing.T) {
	if _, err := metrics.New(nil, metrics.Options{}); err == nil {
		t.Fatal("New(nil) succeeded")
	}
	reg := prometheus.NewRegistry()
	if _, err := metrics.New(reg, metrics.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.New(reg, metrics.Options{}); err == nil {
		t.Fatal("second New on one registry succeeded")
	}
	if _, err := metrics.New(prometheus.NewRegistry(), metrics.Options{Classes: []string{""}}); err == nil {
		t.Fatal("an empty class name was accepted")
	}
	if _, err := metrics.New(prometheus.NewRegistry(), metrics.Options{MaxClasses: -1}); err == nil {
		t.Fatal("a negative cap was accepted")
	}
}

func TestHeldGauges(t *testing.T) {
	m, reg := newMetrics(t, metrics.Options{})
	orders := m.Class("orders")
	t0 := time.Unix(1700000000, 0)
	remove := m.AddHeldSource(func(yield func(*metrics.Class, time.Time)) {
		yield(orders, t0.Add(time.Minute))
		yield(orders, t0)
		yield(m.Class(""), t0.Add(time.Hour))
	})
	want := `
# HELP shardlock_locks_held Locks held by this process now.
# TYPE shardlock_locks_held gauge
shardlock_locks_held{lock_class="default"} 1
shardlock_locks_held{lock_class="orders"} 2
# HELP shardlock_oldest_lock_acquired_timestamp_seconds Unix time of the acquisition of the oldest lock this process holds; 0 when it holds none.
# TYPE shardlock_oldest_lock_acquired_timestamp_seconds gauge
shardlock_oldest_lock_acquired_timestamp_seconds{lock_class="default"} 1.7000036e+09
shardlock_oldest_lock_acquired_timestamp_seconds{lock_class="orders"} 1.7e+09
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), metrics.LocksHeld, metrics.OldestLockAcquiredTimestampSeconds); err != nil {
		t.Fatal(err)
	}
	remove()
	want = strings.NewReplacer(`"} 1
`, `"} 0
`, `"} 2
`, `"} 0
`, "1.7000036e+09", "0", "1.7e+09", "0").Replace(want)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), metrics.LocksHeld, metrics.OldestLockAcquiredTimestampSeconds); err != nil {
		t.Fatal(err)
	}
}

func TestNilClassIsNoOp(t *testing.T) {
	var m *metrics.Metrics
	c := m.Class("x")
	c.Acquired(time.Second)
	c.AcquireFailed(time.Second, metrics.ReasonTimeout)
	c.Released(time.Second, metrics.ReasonExpired)
	c.Renewed("")
	c.Lost(time.Second, metrics.ReasonValidity)
	c.Waiting(1)
	m.AddHeldSource(nil)()
}
