package manager

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/shardlock/shardlock/sharding"
)

// MaxStripes bounds the stripes of a striped lock and the permits of a pool.
const MaxStripes = 1024

func stripeName(resource string, n, i int) (string, error) {
	if n < 1 || n > MaxStripes {
		return "", invalid("stripes", "%d is outside [1, %d]", n, MaxStripes)
	}
	r, err := sharding.StripeResource(resource, n, i)
	if err != nil {
		return "", invalid("resource", "%q cannot be striped: it must be non-empty and carry no hash tag", resource)
	}
	return r, nil
}

// AcquireStripe takes, as Acquire does, the stripe of a hot resource that
// partition maps to: one of stripes locks "<resource>#<i>" with i =
// sharding.StripeIndex(partition, stripes). Work on partitions of different
// stripes runs in parallel; each stripe key has its own hash tag, so the
// stripes spread over slots and masters. The mapping depends only on
// (resource, stripes, partition), never on the topology.
//
// It returns an *InvalidArgumentError for stripes outside [1, MaxStripes]
// or a resource with a hash tag of its own, and otherwise what Acquire returns.
func (m *Manager) AcquireStripe(ctx context.Context, resource string, stripes int, partition string, opts ...AcquireOption) (*Lock, error) {
	name, err := stripeName(resource, stripes, sharding.StripeIndex(partition, stripes))
	if err != nil {
		return nil, err
	}
	return m.Acquire(ctx, name, opts...)
}

// AcquireAny takes any free one of permits locks on resource, an N-holder
// semaphore: the permits are the locks "<resource>#0" .. "<resource>#N-1".
// Each round tries every permit once, from a random one so that callers
// spread; between rounds it waits as Acquire does (retry strategy, wait
// limit, ctx). The returned lock's Resource names the permit taken.
//
// It returns an *InvalidArgumentError for permits outside [1, MaxStripes]
// or a resource with a hash tag of its own, and otherwise what Acquire returns.
func (m *Manager) AcquireAny(ctx context.Context, resource string, permits int, opts ...AcquireOption) (*Lock, error) {
	if _, err := stripeName(resource, permits, 0); err != nil {
		return nil, err // before any allocation sized by permits
	}
	names := make([]string, permits)
	for i := range permits {
		names[i], _ = stripeName(resource, permits, i)
	}
	ac, _, err := m.acquireConfig(names[0], opts)
	if err != nil {
		return nil, err
	}
	if ctx == nil {
		return nil, invalid("context", "nil")
	}
	waitUntil := time.Now().Add(ac.wait)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for round := 1; ; round++ {
		start := rand.IntN(permits)
		for k := range permits {
			l, err := m.TryAcquire(ctx, names[(start+k)%permits], opts...)
			if err == nil {
				return l, nil
			}
			if !errors.Is(err, ErrNotAcquired) {
				return nil, err
			}
		}
		d, ok := nextWait(ac.retry, round, waitUntil)
		if !ok {
			return nil, ErrNotAcquired
		}
		resetTimer(&timer, d)
		select {
		case <-ctx.Done():
			return nil, errors.Join(ErrNotAcquired, ctx.Err())
		case <-timer.C:
		}
	}
}
