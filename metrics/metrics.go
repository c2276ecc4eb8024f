package metrics

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxClasses is the default cap on distinct lock classes.
const DefaultMaxClasses = 10

// Options configures New.
type Options struct {
	// Classes, when set, is the full set of lock classes; any other class is
	// counted as "other". "default" is always allowed.
	Classes []string
	// MaxClasses caps the distinct classes used (besides default, other and
	// overflow); later ones are counted as "overflow". 0 means
	// DefaultMaxClasses.
	MaxClasses int
}

// Metrics holds the library's collectors. It is safe for concurrent use;
// several managers may share one.
type Metrics struct {
	maxClasses int
	allowed    map[string]bool

	attempts, acqFailures, releases, relFailures, renewals, renFailures, lost, forced *prometheus.CounterVec
	acqDuration, holdDuration                                                         *prometheus.HistogramVec
	waiters                                                                           *prometheus.GaugeVec

	mu      sync.RWMutex
	classes map[string]*Class
	named   int // classes other than the special ones

	srcMu   sync.Mutex
	sources map[int]HeldFunc
	nextSrc int
	held    *prometheus.Desc
	oldest  *prometheus.Desc
}

// HeldFunc reports every lock a manager holds now, for the held-locks and
// oldest-lock gauges, which are computed at scrape time.
type HeldFunc func(yield func(c *Class, acquiredAt time.Time))

func desc(name string) Desc {
	for _, d := range Library {
		if d.Name == name {
			return d
		}
	}
	panic("metrics: " + name + " is not in the catalogue")
}

func counterVec(name string) *prometheus.CounterVec {
	d := desc(name)
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: d.Name, Help: d.Help}, d.Labels)
}

func histogramVec(name string, buckets []float64) *prometheus.HistogramVec {
	d := desc(name)
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: d.Name, Help: d.Help, Buckets: buckets}, d.Labels)
}

// New makes the library's collectors and registers them on reg. It
// returns an error when reg is nil, the options are bad, or registration
// fails (a second New on the same registry: share one *Metrics instead).
func New(reg prometheus.Registerer, opts Options) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("metrics: nil Registerer")
	}
	if opts.MaxClasses < 0 {
		return nil, fmt.Errorf("metrics: MaxClasses %d is negative", opts.MaxClasses)
	}
	m := &Metrics{
		maxClasses:   opts.MaxClasses,
		attempts:     counterVec(AcquireAttemptsTotal),
		acqFailures:  counterVec(AcquireFailuresTotal),
		releases:     counterVec(ReleasesTotal),
		relFailures:  counterVec(ReleaseFailuresTotal),
		renewals:     counterVec(RenewalsTotal),
		renFailures:  counterVec(RenewalFailuresTotal),
		lost:         counterVec(LocksLostTotal),
		forced:       counterVec(ForceReleasesTotal),
		acqDuration:  histogramVec(AcquireDurationSeconds, AcquireBuckets),
		holdDuration: histogramVec(HoldDurationSeconds, HoldBuckets),
		waiters: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: Waiters, Help: desc(Waiters).Help},
			desc(Waiters).Labels),
		classes: map[string]*Class{},
		sources: map[int]HeldFunc{},
		held:    prometheus.NewDesc(LocksHeld, desc(LocksHeld).Help, desc(LocksHeld).Labels, nil),
		oldest: prometheus.NewDesc(OldestLockAcquiredTimestampSeconds,
			desc(OldestLockAcquiredTimestampSeconds).Help, desc(OldestLockAcquiredTimestampSeconds).Labels, nil),
	}
	if m.maxClasses == 0 {
		m.maxClasses = DefaultMaxClasses
	}
	if len(opts.Classes) > 0 {
		m.allowed = map[string]bool{}
		for _, c := range opts.Classes {
			if err := checkClassName(c); err != nil {
				return nil, err
			}
			m.allowed[c] = true
		}
	}
	for _, c := range []prometheus.Collector{m.attempts, m.acqFailures, m.releases, m.relFailures,
		m.renewals, m.renFailures, m.lost, m.forced, m.acqDuration, m.holdDuration, m.waiters, heldCollector{m}} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: register: %w", err)
		}
	}
	m.Class(ClassDefault) // its series exist at 0 from the start
	return m, nil
}

func checkClassName(c string) error {
	if c == "" || len(c) > 64 || !utf8.ValidString(c) || strings.ContainsFunc(c, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fmt.Errorf("metrics: bad lock class %q: want 1 to 64 printable bytes of UTF-8", c)
	}
	return nil
}

// ClassLabel returns name when it can be a lock_class label value (1 to 64
// printable bytes of UTF-8), else ClassOther. A label value that is not
// UTF-8 makes client_golang panic; every class label goes through this.
func ClassLabel(name string) string {
	if checkClassName(name) != nil {
		return ClassOther
	}
	return name
}

// Class returns the recorder of a lock class: name itself, or "default"
// for "", "other" for a name outside Options.Classes or not printable,
// "overflow" past Options.MaxClasses. It is cheap after the first call.
func (m *Metrics) Class(name string) *Class {
	if m == nil {
		return nil
	}
	if name == "" {
		name = ClassDefault
	}
	m.mu.RLock()
	c := m.classes[name]
	m.mu.RUnlock()
	if c != nil {
		return c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.classes[name]; c != nil {
		return c
	}
	label := name
	switch {
	case name == ClassDefault || name == ClassOther || name == ClassOverflow:
	case checkClassName(name) != nil || (m.allowed != nil && !m.allowed[name]):
		label = ClassOther
	case m.named >= m.maxClasses:
		label = ClassOverflow
	default:
		m.named++
	}
	c = m.classes[label]
	if c == nil {
		c = m.newClass(label)
		m.classes[label] = c
	}
	// Remember where the name went, without letting unbounded names grow
	// the map: only named classes and the special ones are kept.
	if label == name {
		m.classes[name] = c
	}
	return c
}

func (m *Metrics) newClass(label string) *Class {
	c := &Class{
		name:     label,
		attempts: m.attempts.WithLabelValues(label),
		acqDur:   m.acqDuration.WithLabelValues(label),
		releases: m.releases.WithLabelValues(label),
		renewals: m.renewals.WithLabelValues(label),
		hold:     m.holdDuration.WithLabelValues(label),
		waiters:  m.waiters.WithLabelValues(label),
		forced:   m.forced.WithLabelValues(label),
		acqFail:  map[string]prometheus.Counter{},
		relFail:  map[string]prometheus.Counter{},
		renFail:  map[string]prometheus.Counter{},
		lost:     map[string]prometheus.Counter{},
	}
	for _, r := range AcquireFailureReasons {
		c.acqFail[r] = m.acqFailures.WithLabelValues(label, r)
	}
	for _, r := range ReleaseFailureReasons {
		c.relFail[r] = m.relFailures.WithLabelValues(label, r)
	}
	for _, r := range RenewalFailureReasons {
		c.renFail[r] = m.renFailures.WithLabelValues(label, r)
	}
	for _, r := range LostReasons {
		c.lost[r] = m.lost.WithLabelValues(label, r)
	}
	return c
}

// AddHeldSource registers a manager's held locks for the held-locks and
// oldest-lock gauges. The returned function removes it.
func (m *Metrics) AddHeldSource(f HeldFunc) (remove func()) {
	if m == nil || f == nil {
		return func() {}
	}
	m.srcMu.Lock()
	id := m.nextSrc
	m.nextSrc++
	m.sources[id] = f
	m.srcMu.Unlock()
	return func() {
		m.srcMu.Lock()
		delete(m.sources, id)
		m.srcMu.Unlock()
	}
}

// heldCollector computes the held-locks and oldest-lock gauges at scrape time.
type heldCollector struct{ m *Metrics }

func (h heldCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- h.m.held
	ch <- h.m.oldest
}

func (h heldCollector) Collect(ch chan<- prometheus.Metric) {
	type agg struct {
		n      int
		oldest time.Time
	}
	per := map[string]*agg{}
	h.m.mu.RLock()
	for _, c := range h.m.classes {
		per[c.name] = &agg{}
	}
	h.m.mu.RUnlock()
	h.m.srcMu.Lock()
	sources := make([]HeldFunc, 0, len(h.m.sources))
	for _, f := range h.m.sources {
		sources = append(sources, f)
	}
	h.m.srcMu.Unlock()
	for _, f := range sources {
		f(func(c *Class, at time.Time) {
			if c == nil {
				return
			}
			a := per[c.name]
			if a == nil {
				a = &agg{}
				per[c.name] = a
			}
			a.n++
			if a.oldest.IsZero() || at.Before(a.oldest) {
				a.oldest = at
			}
		})
	}
	for name, a := range per {
		ch <- prometheus.MustNewConstMetric(h.m.held, prometheus.GaugeValue, float64(a.n), name)
		var ts float64
		if !a.oldest.IsZero() {
			ts = float64(a.oldest.UnixNano()) / 1e9
		}
		ch <- prometheus.MustNewConstMetric(h.m.oldest, prometheus.GaugeValue, ts, name)
	}
}

// Class records the events of one lock class. Its methods are safe for
// concurrent use, and do nothing on a nil *Class (metrics off).
type Class struct {
	name                            string
	attempts, releases, renewals    prometheus.Counter
	forced                          prometheus.Counter
	acqDur, hold                    prometheus.Observer
	waiters                         prometheus.Gauge
	acqFail, relFail, renFail, lost map[string]prometheus.Counter // read-only after newClass
}

// Name returns the class label value.
func (c *Class) Name() string {
	if c == nil {
		return ""
	}
	return c.name
}

// Acquired records an acquire that took the lock after d.
func (c *Class) Acquired(d time.Duration) {
	if c == nil {
		return
	}
	c.attempts.Inc()
	c.acqDur.Observe(d.Seconds())
}

// AcquireFailed records an acquire that ended without the lock after d.
func (c *Class) AcquireFailed(d time.Duration, reason string) {
	if c == nil {
		return
	}
	c.attempts.Inc()
	c.acqDur.Observe(d.Seconds())
	inc(c.acqFail, reason, ReasonRedisError)
}

// Released records a release of a lock held for hold; reason is "" when the
// key was deleted, else why not.
func (c *Class) Released(hold time.Duration, reason string) {
	if c == nil {
		return
	}
	c.releases.Inc()
	c.hold.Observe(hold.Seconds())
	if reason != "" {
		inc(c.relFail, reason, ReasonRedisError)
	}
}

// Renewed records a renewal; reason is "" when it succeeded.
func (c *Class) Renewed(reason string) {
	if c == nil {
		return
	}
	c.renewals.Inc()
	if reason != "" {
		inc(c.renFail, reason, ReasonRedisError)
	}
}

// Lost records a lock lost after hold, for reason.
func (c *Class) Lost(hold time.Duration, reason string) {
	if c == nil {
		return
	}
	c.hold.Observe(hold.Seconds())
	inc(c.lost, reason, ReasonExpired)
}

// ForceReleased records a lock removed by ForceRelease.
func (c *Class) ForceReleased() {
	if c == nil {
		return
	}
	c.forced.Inc()
}

// Waiting adds delta to the waiters gauge.
func (c *Class) Waiting(delta int) {
	if c == nil {
		return
	}
	c.waiters.Add(float64(delta))
}

func inc(m map[string]prometheus.Counter, reason, fallback string) {
	if ctr, ok := m[reason]; ok {
		ctr.Inc()
		return
	}
	m[fallback].Inc()
}
