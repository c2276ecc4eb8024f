package manager

import (
	"math"
	"time"
)

// mono is a reading of this process's monotonic clock, in nanoseconds since
// epoch. Locks keep their deadlines as mono (8 bytes) rather than time.Time
// (24): a Lock is allocated on every acquire. Wall-clock jumps never move it.
type mono int64

var epoch = time.Now()

func monoNow() mono { return mono(time.Since(epoch)) }

// monoOf converts t, which must carry a monotonic reading (any time.Now()).
func monoOf(t time.Time) mono { return mono(t.Sub(epoch)) }

func (m mono) Time() time.Time { return epoch.Add(time.Duration(m)) }

// Add saturates: a duration past the end of time (a max hold of
// math.MaxInt64, say) stays at the end of time instead of wrapping.
func (m mono) Add(d time.Duration) mono {
	s := m + mono(d)
	switch {
	case d > 0 && s < m:
		return math.MaxInt64
	case d < 0 && s > m:
		return math.MinInt64
	}
	return s
}
func (m mono) Before(o mono) bool       { return m < o }
func (m mono) After(o mono) bool        { return m > o }
func (m mono) IsZero() bool             { return m == 0 }
func (m mono) Sub(o mono) time.Duration { return time.Duration(m - o) }

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
