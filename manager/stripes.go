package manager

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/sharding"
)

// MaxStripes bounds the stripes of a striped lock and the permits of a pool.
const MaxStripes = 1024

// stripeNames checks a striped resource (what names its n stripes or
// permits: kind) and returns the name of each index in idx, or of all n
// when idx is empty.
func stripeNames(kind, resource string, n int, idx ...int) ([]string, error) {
	if n < 1 || n > MaxStripes {
		return nil, invalid(kind, "%d is outside [1, %d]", n, MaxStripes)
	}
	// The longest name is "<resource>#<n-1>": the resource must leave room.
	if most := MaxResourceLen - len("#") - len(strconv.Itoa(n-1)); len(resource) > most {
		return nil, invalid("resource", "%d bytes, more than %d (a resource with %d %s)", len(resource), most, n, kind)
	}
	if resource == "" {
		return nil, invalid("resource", "empty")
	}
	if _, ok := sharding.HashTag(resource); ok {
		return nil, invalid("resource", "%q cannot have %s: it carries a hash tag of its own", resource, kind)
	}
	if len(idx) == 0 {
		idx = make([]int, n)
		for i := range idx {
			idx[i] = i
		}
	}
	names := make([]string, len(idx))
	for k, i := range idx {
		names[k], _ = sharding.StripeResource(resource, n, i) // checked above
	}
	return names, nil
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
	return m.acquireStripe(ctx, resource, stripes, partition, opts, true)
}

// TryAcquireStripe is AcquireStripe with one attempt, as TryAcquire.
func (m *Manager) TryAcquireStripe(ctx context.Context, resource string, stripes int, partition string, opts ...AcquireOption) (*Lock, error) {
	return m.acquireStripe(ctx, resource, stripes, partition, opts, false)
}

func (m *Manager) acquireStripe(ctx context.Context, resource string, stripes int, partition string, opts []AcquireOption, wait bool) (*Lock, error) {
	if err := m.open(); err != nil {
		return nil, err
	}
	names, err := stripeNames("stripes", resource, stripes, sharding.StripeIndex(partition, stripes))
	if err != nil {
		return nil, err
	}
	return m.acquire(ctx, names[0], opts, kindExclusive, wait)
}

// AcquireAny takes any free one of permits locks on resource, an N-holder
// semaphore: the permits are the locks "<resource>#0" .. "<resource>#N-1".
// Each round reads which permits are free (one pipelined GET per permit, one
// pipeline per node, the nodes in parallel) and tries the free ones, from a
// random one so that callers spread: one more round trip when the first
// free permit is still free. Between rounds it waits as Acquire does (retry
// strategy, wait limit, ctx). The returned lock's Resource names the permit
// taken.
//
// It returns an *InvalidArgumentError for permits outside [1, MaxStripes]
// or a resource with a hash tag of its own, and otherwise what Acquire returns.
func (m *Manager) AcquireAny(ctx context.Context, resource string, permits int, opts ...AcquireOption) (*Lock, error) {
	return m.acquireAny(ctx, resource, permits, opts, true)
}

// TryAcquireAny is AcquireAny with one round: it reads which permits are
// free and tries them, and returns ErrNotAcquired when none could be had.
func (m *Manager) TryAcquireAny(ctx context.Context, resource string, permits int, opts ...AcquireOption) (*Lock, error) {
	return m.acquireAny(ctx, resource, permits, opts, false)
}

func (m *Manager) acquireAny(ctx context.Context, resource string, permits int, opts []AcquireOption, wait bool) (*Lock, error) {
	if err := m.open(); err != nil {
		return nil, err
	}
	names, err := stripeNames("permits", resource, permits)
	if err != nil {
		return nil, err
	}
	ac, _, err := m.acquireConfig(names[len(names)-1], opts)
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
		free, err := m.freePermits(ctx, names)
		if err != nil {
			return nil, errors.Join(ErrNotAcquired, err)
		}
		start := rand.IntN(permits)
		for k := range permits {
			i := (start + k) % permits
			if !free[i] {
				continue
			}
			l, err := m.TryAcquire(ctx, names[i], opts...)
			if err == nil {
				return l, nil
			}
			if !errors.Is(err, ErrNotAcquired) {
				return nil, err
			}
		}
		if !wait {
			return nil, ErrNotAcquired
		}
		d, ok := nextWait(ac.retry, round, waitUntil)
		if !ok {
			return nil, ErrNotAcquired
		}
		resetTimer(&timer, d)
		select {
		case <-ctx.Done():
			return nil, errors.Join(ErrNotAcquired, ctx.Err())
		case <-m.closing:
			return nil, ErrClosed
		case <-timer.C:
		}
	}
}

// freePermits reads which of the permits (resources) look free, with one
// pipelined GET each (one pipeline per node). A permit whose read failed
// counts as free: the attempt on it finds out.
// It returns an error only when Redis did not answer by ctx's end.
func (m *Manager) freePermits(ctx context.Context, resources []string) ([]bool, error) {
	return transport.Exchange(m.tr, ctx, time.Time{}, func(ctx context.Context) ([]bool, error) {
		pipe := m.client.Pipeline()
		cmds := make([]*redis.StringCmd, len(resources))
		for i, r := range resources {
			key, _ := sharding.LockKey(m.cfg.prefix, r) // checked by stripeNames
			cmds[i] = pipe.Get(ctx, key)
		}
		_, _ = pipe.Exec(ctx) // per-command results below; nil means free
		free := make([]bool, len(resources))
		for i, c := range cmds {
			err := c.Err()
			free[i] = err != nil // redis.Nil: free; another error: let the attempt tell
		}
		return free, nil
	}, nil)
}
