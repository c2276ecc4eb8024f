package transport

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// RetryTransient runs op until it returns nil or an error that is not
// transient, until deadline (zero: none) or ctx ends, with jittered
// exponential backoff from 10 ms to 500 ms between tries. On a transient
// error it asks a cluster client to reload its slot map, so a failover is
// followed without waiting for a redirect.
func (t *Transport) RetryTransient(ctx context.Context, deadline time.Time, op func(context.Context) error) error {
	return t.RetryWhile(ctx, deadline, IsTransient, op)
}

// RetryWhile is RetryTransient for the errors retryable accepts.
func (t *Transport) RetryWhile(ctx context.Context, deadline time.Time, retryable func(error) bool, op func(context.Context) error) error {
	err := op(ctx)
	if err == nil || !retryable(err) || ctx.Err() != nil {
		return withCtxErr(ctx, err)
	}
	// The retry loop and its deadline are set up only when needed: the
	// first try is the hot path.
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	for attempt := 1; ; attempt++ {
		t.Reload(ctx)
		timer.Reset(TransientBackoff(attempt))
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-timer.C:
		}
		err = op(ctx)
		if err == nil || !retryable(err) || ctx.Err() != nil {
			return withCtxErr(ctx, err)
		}
	}
}

// withCtxErr joins ctx's error to err when ctx has ended and err does not say so.
func withCtxErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return errors.Join(err, ctx.Err())
	}
	return err
}

func TransientBackoff(attempt int) time.Duration {
	ceil := 500 * time.Millisecond
	if attempt < 6 {
		ceil = (10 * time.Millisecond) << (attempt - 1)
	}
	return ceil/2 + rand.N(ceil/2+1)
}
