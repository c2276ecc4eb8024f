package manager

import (
	"math"
	"math/rand/v2"
	"reflect"
	"time"
)

// RetryStrategy decides how long Acquire waits before its next attempt.
//
// NextBackoff gets the number of attempts made so far (1 after the first)
// and returns the pause before the next one; zero or a negative duration
// stops retrying, as in bsm/redislock, so a strategy ported from there
// means the same here and none retries in a tight loop by accident. An attempt is a round trip to Redis; a lock handed over by the
// release before is taken without one. A strategy given with WithRetry (to
// New or to one acquire) is followed exactly, queued or not: NoRetry makes one
// attempt, LimitRetry(s, n) n. The default strategy's waits while queued
// in the fair queue are at least 100 ms (the release hands the lock over
// at once). It is called concurrently by every waiting Acquire of a Manager,
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
	return RetryFunc(func(int) time.Duration { return 0 })
}

// LinearBackoff waits d plus up to d/2 of random jitter between attempts
// (at most the longest time.Duration), so that waiters that collided once
// spread out. A d of zero or less makes one attempt.
func LinearBackoff(d time.Duration) RetryStrategy {
	return RetryFunc(func(int) time.Duration {
		if d <= 0 {
			return 0
		}
		return addSat(d, rand.N(d/2+1))
	})
}

// ExponentialBackoff waits a random time in (0, c], c = min(max,
// base·2^(attempt-1)) ("full jitter"), so waiters that collided once
// spread out instead of colliding again; a waiter that drew a long wait
// is not the one that always loses. A base or max of zero or less makes
// one attempt.
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
			if c := base << (attempt - 1); c > 0 && c < max && c>>(attempt-1) == base {
				ceil = c
			}
		}
		if d := upTo(ceil); d > 0 {
			return d
		}
		return 1 // never 0, which would stop
	})
}

// upTo returns a random duration in [0, d], d >= 0.
func upTo(d time.Duration) time.Duration {
	if d == math.MaxInt64 {
		return rand.N(d) // [0, d): d+1 would overflow
	}
	return rand.N(d + 1)
}

// addSat adds two non-negative durations, saturating at the longest one.
func addSat(a, b time.Duration) time.Duration {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}

// LimitRetry stops s after n attempts in all.
func LimitRetry(s RetryStrategy, n int) RetryStrategy { return limitRetry{s: s, n: n} }

type limitRetry struct {
	s RetryStrategy
	n int
}

func (r limitRetry) NextBackoff(attempt int) time.Duration {
	if attempt >= r.n {
		return -1
	}
	return r.s.NextBackoff(attempt)
}

func (r limitRetry) check() error { return checkRetry(r.s) }

// checkRetry rejects a strategy that would panic when asked: nil, a typed
// nil (a nil RetryFunc, a nil pointer), or a LimitRetry of one.
func checkRetry(s RetryStrategy) error {
	if isNil(s) {
		return invalid("retry", "nil strategy")
	}
	if c, ok := s.(interface{ check() error }); ok {
		return c.check()
	}
	return nil
}

// isNil reports whether x is nil or an interface holding a nil pointer,
// function, map, slice or channel.
func isNil(x any) bool {
	if x == nil {
		return true
	}
	switch v := reflect.ValueOf(x); v.Kind() {
	case reflect.Pointer, reflect.Func, reflect.Map, reflect.Slice, reflect.Chan, reflect.Interface, reflect.UnsafePointer:
		return v.IsNil()
	}
	return false
}

// DefaultRetry is Acquire's strategy unless told otherwise: exponential
// backoff with full jitter from 50 ms, doubling up to 1 s, for at most 64
// attempts (the seeds' 50 ms doubling, capped). DefaultWait bounds it in time.
// Left as the default (no WithRetry), the attempts a batch waiter makes
// when a release wakes it are not among the 64: every release of a key
// wakes every batch waiter of it, and all but one lose the race.
func DefaultRetry() RetryStrategy {
	return LimitRetry(ExponentialBackoff(50*time.Millisecond, time.Second), 64)
}
