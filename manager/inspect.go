package manager

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/sharding"
)

// LockInfo is what Inspect tells about a lock: who holds it and for how
// long, its fence, and its waiters. It never carries a token's secret part.
type LockInfo struct {
	Resource string
	Key      string
	// Held: the key exists. Foreign: it holds something that is not a
	// shardlock token (another value, another type); Owner and AcquiredAt
	// are then empty.
	Held, Foreign bool
	Owner         string    // the holder's owner id (WithOwner)
	AcquiredAt    time.Time // when the holder's acquire began
	TTL           time.Duration
	Fence         uint64 // the lock's fence counter: its latest fence (0: never fenced)
	Waiters       int    // waiters queued in Redis (the fair queue), one per waiting process
	// OldestWait is how long the first queued waiter has waited (0 with
	// none), by this process's clock against the time in its token.
	OldestWait time.Duration
}

// Inspect reads what an operator needs to know about resource's lock, in
// one pipeline on the master that serves it, and changes nothing. It
// returns an *InvalidArgumentError for a bad resource before any round
// trip.
func (m *Manager) Inspect(ctx context.Context, resource string) (LockInfo, error) {
	if err := m.usable(); err != nil {
		return LockInfo{}, err
	}
	if ctx == nil {
		return LockInfo{}, invalid("context", "nil")
	}
	key, err := m.lockKey(resource)
	if err != nil {
		return LockInfo{}, err
	}
	return exchange(m, ctx, time.Time{}, func(ctx context.Context) (LockInfo, error) {
		node, err := m.topo.masterFor(ctx, key)
		if err != nil {
			return LockInfo{}, err
		}
		queue := sharding.QueueKey(key)
		pipe := node.Pipeline()
		val := pipe.Get(ctx, key)
		pttl := pipe.PTTL(ctx, key)
		exists := pipe.Exists(ctx, key)
		fence := pipe.Get(ctx, sharding.FenceKey(key))
		waiters := pipe.LLen(ctx, queue)
		first := pipe.LIndex(ctx, queue, 0)
		_, _ = pipe.Exec(ctx) // each reply is read below; a key of another type answers its own error
		if err := firstErr(exists, pttl); err != nil {
			return LockInfo{}, fmt.Errorf("shardlock: inspect %q: %w", resource, err)
		}
		info := LockInfo{Resource: resource, Key: key, Held: exists.Val() == 1}
		if d := pttl.Val(); d > 0 {
			info.TTL = d
		}
		if info.Held {
			if v, err := val.Result(); err != nil {
				info.Foreign = true // another type
			} else if ti, err := ParseToken(v); err != nil {
				info.Foreign = true
			} else {
				info.Owner, info.AcquiredAt = ti.Owner, ti.AcquiredAt
			}
		}
		info.Fence, _ = fence.Uint64() // absent or junk: 0
		if n, err := waiters.Result(); err == nil {
			info.Waiters = int(n)
		}
		if e, err := first.Result(); err == nil {
			if _, tok, ok := cutEntry(e); ok {
				if ti, err := ParseToken(tok); err == nil {
					info.OldestWait = max(time.Since(ti.AcquiredAt), 0)
				}
			}
		}
		return info, nil
	}, nil)
}

// cutEntry splits a queue entry, "<deadline>:<ttl>:<fencing>:<token>" (see
// handover.lua), into its deadline part and its token.
func cutEntry(e string) (deadline, token string, ok bool) {
	parts := strings.SplitN(e, ":", 4)
	if len(parts) != 4 {
		return "", "", false
	}
	return parts[0], parts[3], true
}

// firstErr returns the first error of cmds that is not a nil reply.
func firstErr(cmds ...redis.Cmder) error {
	for _, c := range cmds {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
	}
	return nil
}
