package manager

import (
	"testing"
	"time"
)

func TestRetryStrategies(t *testing.T) {
	for attempt := 1; attempt < 100; attempt++ {
		if d := NoRetry().NextBackoff(attempt); d > 0 {
			t.Fatalf("NoRetry retries: %v", d)
		}
		if d := LinearBackoff(10 * time.Millisecond).NextBackoff(attempt); d < 10*time.Millisecond || d > 15*time.Millisecond {
			t.Fatalf("LinearBackoff(10ms) = %v", d)
		}
		ceil := min(time.Second, 50*time.Millisecond<<min(attempt-1, 30))
		if d := ExponentialBackoff(50*time.Millisecond, time.Second).NextBackoff(attempt); d <= 0 || d > ceil {
			t.Fatalf("ExponentialBackoff attempt %d = %v, want (0, %v]", attempt, d, ceil)
		}
		if d := ExponentialBackoff(time.Nanosecond, time.Nanosecond).NextBackoff(attempt); d <= 0 {
			t.Fatalf("ExponentialBackoff(1ns) = %v: a retry strategy's 0 stops", d)
		}
		d := LimitRetry(LinearBackoff(time.Millisecond), 5).NextBackoff(attempt)
		if (attempt >= 5) != (d <= 0) {
			t.Fatalf("LimitRetry(5) attempt %d = %v", attempt, d)
		}
	}
	// Zero means stop, as in bsm/redislock: nothing retries at once.
	for _, s := range []RetryStrategy{LinearBackoff(0), ExponentialBackoff(0, time.Second), RetryFunc(func(int) time.Duration { return 0 })} {
		if d, ok := nextWait(s, 1, time.Now().Add(time.Minute)); ok {
			t.Fatalf("a zero backoff retries after %v", d)
		}
	}
	// Jitter spreads: 1000 draws at the cap are not all equal.
	seen := map[time.Duration]bool{}
	for range 1000 {
		seen[ExponentialBackoff(50*time.Millisecond, time.Second).NextBackoff(10)] = true
	}
	if len(seen) < 100 {
		t.Fatalf("ExponentialBackoff drew only %d distinct waits", len(seen))
	}
}
