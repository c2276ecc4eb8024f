package manager

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/sharding"
)

// Leader election, built on the lock: the leader of an election is the
// holder of its lock ("election:<name>"), taken with fencing, renewed by
// the watchdog, waited for through the fair queue. A term is the lock's
// fence: it rises with every new leader.

// ErrNoLeader is what Leader returns when nobody leads the election.
var ErrNoLeader = errors.New("shardlock: no leader")

// electionPrefix names an election's lock resource.
const electionPrefix = "election:"

// observeEvery is how often Observe reads who leads.
const observeEvery = 50 * time.Millisecond

// Leadership is this process's term as the leader of an election, won by
// Campaign. It lasts until Resign, the manager's Close, or the loss of its
// lock, which the watchdog notices within one renewal period.
type Leadership struct {
	name string
	l    *Lock
}

// Name returns the election's name ("" for a nil Leadership).
func (ld *Leadership) Name() string {
	if ld == nil {
		return ""
	}
	return ld.name
}

// lock is the election's lock: nil for a nil Leadership, whose methods
// then answer as a nil *Lock's do (ErrNilLock).
func (ld *Leadership) lock() *Lock {
	if ld == nil {
		return nil
	}
	return ld.l
}

// Term returns the term: a number that rises with every new leader of the
// election. Pass it with the leader's writes and have the storage reject a
// lower one, as with a lock's fence.
func (ld *Leadership) Term() uint64 { return ld.lock().Fence() }

// Done returns a channel closed when the leadership ends (its lock lost or
// released).
func (ld *Leadership) Done() <-chan struct{} { return ld.lock().Done() }

// Context returns a context cancelled when the leadership ends: run the
// leader's work under it.
func (ld *Leadership) Context() context.Context { return ld.lock().Context() }

// Err returns why the leadership ended (see Lock.Err), or nil.
func (ld *Leadership) Err() error { return ld.lock().Err() }

// Resign ends the leadership: the next campaigner, if any, is handed it.
func (ld *Leadership) Resign(ctx context.Context) error { return ld.lock().Release(ctx) }

// LeaderInfo says who leads an election: the leader's owner id (WithOwner),
// its term, and when it took the lead.
type LeaderInfo struct {
	Owner string
	Term  uint64
	Since time.Time
}

// electionKey checks name and returns its election's resource and key.
func (m *Manager) electionKey(name string) (resource, key string, err error) {
	if name == "" {
		return "", "", invalid("election", "empty name")
	}
	resource = electionPrefix + name
	key, err = m.lockKey(resource)
	if err != nil {
		return "", "", invalid("election", "%q: %v", name, err)
	}
	return resource, key, nil
}

// Campaign blocks until this process leads the election name, or ctx ends.
// It waits in the fair queue of the election's lock (a leader that resigns
// hands the lead to the next campaigner at once) for as long as ctx
// allows; opts set the lock's TTL and retry strategy as for Acquire, and
// fencing is always on (the term). An empty name is an
// *InvalidArgumentError.
func (m *Manager) Campaign(ctx context.Context, name string, opts ...AcquireOption) (*Leadership, error) {
	if err := m.open(); err != nil {
		return nil, err
	}
	resource, _, err := m.electionKey(name)
	if err != nil {
		return nil, err
	}
	opts = append(append([]AcquireOption(nil), opts...), WithFencing(true), WithWait(MaxWait))
	for {
		l, err := m.Acquire(ctx, resource, opts...)
		if err == nil {
			return &Leadership{name: name, l: l}, nil
		}
		if ctx == nil || ctx.Err() != nil || !errors.Is(err, ErrNotAcquired) || errors.Is(err, ErrTooManyWaiters) {
			return nil, err
		}
		// The wait limit (a day) passed: campaign on.
	}
}

// Leader reads who leads the election name now: ErrNoLeader when nobody
// does.
func (m *Manager) Leader(ctx context.Context, name string) (LeaderInfo, error) {
	if err := m.open(); err != nil {
		return LeaderInfo{}, err
	}
	_, key, err := m.electionKey(name)
	if err != nil {
		return LeaderInfo{}, err
	}
	if ctx == nil {
		return LeaderInfo{}, invalid("context", "nil")
	}
	return transport.Exchange(m.tr, ctx, time.Time{}, func(ctx context.Context) (LeaderInfo, error) {
		pipe := m.client.Pipeline()
		holder := pipe.Get(ctx, key)
		fence := pipe.Get(ctx, sharding.FenceKey(key))
		_, _ = pipe.Exec(ctx)
		v, err := holder.Result()
		if errors.Is(err, redis.Nil) {
			return LeaderInfo{}, ErrNoLeader
		}
		if err != nil {
			return LeaderInfo{}, fmt.Errorf("shardlock: leader %q: %w", name, err)
		}
		info, err := ParseToken(v)
		if err != nil {
			return LeaderInfo{}, ErrNoLeader // not a shardlock token: no leader of ours
		}
		term, _ := fence.Uint64()
		return LeaderInfo{Owner: info.Owner, Term: term, Since: info.AcquiredAt}, nil
	}, nil)
}

// Observe reports who leads the election name each time it changes (and
// once at the start): a LeaderInfo, or the zero LeaderInfo while nobody
// leads. It reads every 50 ms, so a leadership shorter than that may go
// unseen; what it reports comes in the order of terms. The channel is
// closed when ctx ends or the manager closes. Observe returns an
// *InvalidArgumentError for an empty name or a nil ctx.
func (m *Manager) Observe(ctx context.Context, name string) (<-chan LeaderInfo, error) {
	if err := m.open(); err != nil {
		return nil, err
	}
	if _, _, err := m.electionKey(name); err != nil {
		return nil, err
	}
	if ctx == nil {
		return nil, invalid("context", "nil")
	}
	out := make(chan LeaderInfo, 1)
	m.bg.Go(func() {
		defer close(out)
		t := time.NewTicker(observeEvery)
		defer t.Stop()
		var last LeaderInfo
		first := true
		for {
			rctx, cancel := context.WithTimeout(ctx, observeEvery*4)
			info, err := m.Leader(rctx, name)
			cancel()
			if err == nil || errors.Is(err, ErrNoLeader) {
				if first || info != last {
					first, last = false, info
					select {
					case out <- info:
					case <-ctx.Done():
						return
					case <-m.closing:
						return
					}
				}
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			case <-m.closing:
				return
			}
		}
	})
	return out, nil
}
