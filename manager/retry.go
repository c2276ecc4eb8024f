package manager

import (
	"math/rand/v2"
	"time"
)

// RetryStrategy decides how long Acquire waits before its next attempt.
//
// NextBackoff gets the number of attempts made so far (1 after the first)
// and returns the pause before the next one, or a negative duration to stop
// retrying. It is called concurrently by every waiting Acquire of a Manager,
// so an implementation must be safe for concurrent use; the built-in ones
// are stateless. The caller's context and the wait limit bound the wait
// whatever the strategy says.
type RetryStrategy interface {
	NextBackoff(attempt int) time.Duration
}

// RetryFunc adapts a function to RetryStrategy.
type RetryFunc func(attempt int) time.Duration

// NextBackoff calls f.
func (f RetryFunc) NextBackoff(attempt int) time.Duration { return f(attempt) }

// NoRetry makes one attempt only.
func NoRetry() RetryStrategy {
	return RetryFunc(func(int) time.Duration { return -1 })
}

// LinearBackoff waits d plus up to d/2 of random jitter between attempts.
func LinearBackoff(d time.Duration) RetryStrategy {
	return RetryFunc(func(int) time.Duration {
		if d <= 0 {
			return 0
		}
		return d + rand.N(d/2+1)
	})
}

// ExponentialBackoff waits a random time in [0, min(max, base·2^(attempt-1))]
// ("full jitter"), so waiters that collided once spread out instead of
// colliding again.
func ExponentialBackoff(base, max time.Duration) RetryStrategy {
	return RetryFunc(func(attempt int) time.Duration {
		if base <= 0 || max <= 0 {
			return 0
		}
		ceil := max
		if attempt < 1 {
			attempt = 1
		}
		if attempt <= 32 {
			if c := base << (attempt - 1); c > 0 && c < max {
				ceil = c
			}
		}
		return rand.N(ceil + 1)
	})
}

// LimitRetry stops s after n attempts in all.
func LimitRetry(s RetryStrategy, n int) RetryStrategy {
	return RetryFunc(func(attempt int) time.Duration {
		if attempt >= n {
			return -1
		}
		return s.NextBackoff(attempt)
	})
}

// DefaultRetry is Acquire's strategy unless told otherwise: exponential
// backoff with full jitter from 50 ms, doubling up to 1 s, for at most 64
// attempts (the seeds' 50 ms doubling, capped). DefaultWait bounds it in time.
func DefaultRetry() RetryStrategy {
	return LimitRetry(ExponentialBackoff(50*time.Millisecond, time.Second), 64)
}
