package manager

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/shardlock/shardlock/internal/scripts"
	"go.uber.org/zap"
)

// Resume takes over a held lock by its token, handed on by another process
// (a job accepted by one process and finished by another): it checks that
// resource's key holds token and returns a *Lock owned by this Manager,
// watched, renewed and released by it like one it acquired. The key's TTL
// is set anew from now (the acquire options' TTL, or the Manager's), and
// with fencing on the Lock's Fence is the lock's fencing token. The process
// that handed the lock on should Forget its Lock, so that one watchdog
// renews it.
//
// It returns ErrNotHeld when another token holds the key, ErrExpired when
// the key is gone, and an *InvalidArgumentError for a token that is not
// one or a bad resource, before any round trip. Batch locks cannot be
// resumed.
func (m *Manager) Resume(ctx context.Context, resource, token string, opts ...AcquireOption) (*Lock, error) {
	if err := m.open(); err != nil {
		return nil, err
	}
	if ctx == nil {
		return nil, invalid("context", "nil")
	}
	ac, key, err := m.acquireConfig(resource, opts)
	if err != nil {
		return nil, err
	}
	info, err := ParseToken(token)
	if err != nil {
		return nil, invalid("token", "not a shardlock token")
	}
	m.resolveClass(&ac, resource)
	ttlMs := strconv.FormatInt(ac.ttl.Milliseconds(), 10)
	var (
		res    []int64
		sentAt time.Time
	)
	err = m.tr.RetryTransient(ctx, time.Time{}, func(ctx context.Context) error {
		sentAt = time.Now()
		var err error
		res, err = m.tr.RunScript(ctx, m.cmd, scripts.Resume, []string{key}, token, ttlMs, luaArg(ac.fencing)).Int64Slice()
		if err == nil && len(res) != 2 {
			err = fmt.Errorf("unexpected reply %v", res)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("shardlock: resume %q: %w", resource, err)
	}
	switch res[0] {
	case scripts.Gone:
		return nil, ErrExpired
	case scripts.NotOurs:
		return nil, ErrNotHeld
	}
	l := m.newLock(kindExclusive, resource, key, token, token, uint64(res[1]), info.AcquiredAt, sentAt, &ac)
	if !monoNow().Before(l.validUntil) {
		return nil, ErrExpired // the reply came after the TTL it set would have run out
	}
	if !m.sched.add(l) {
		return nil, ErrClosed
	}
	return l, nil
}

// Forget stops this Manager renewing and releasing the lock, without
// releasing it: another process has taken it over (Resume), or will. Done
// closes and Context is cancelled with ErrForgotten; Release, Extend and
// TTL then return ErrForgotten without a round trip, and Close leaves the
// lock alone. It returns ErrForgotten for a lock already forgotten, and the
// lock's error (matching ErrLockLost) or ErrReleased for one no longer
// held.
func (l *Lock) Forget() error {
	if l.zero() {
		return ErrNilLock
	}
	l.mu.Lock()
	if l.state != stateHeld {
		err := l.heldErrLocked()
		l.mu.Unlock()
		return err
	}
	l.state, l.err = stateLost, ErrForgotten
	watched := l.w.rn.watched
	l.endLocked(ErrForgotten, true)
	l.mu.Unlock()
	if watched {
		l.m.sched.remove(l)
	}
	l.m.queues.holderGone(l)
	return nil
}

// MaxReasonLen bounds a ForceRelease reason, in bytes.
const MaxReasonLen = 256

// forcedRecordTTL is how long a forced release's record stays beside the
// key: long enough for the evicted holder's next renewal (TTL/3) to read it.
const forcedRecordTTL = 5 * time.Minute

// ForceRelease removes resource's lock whoever holds it, and hands it to
// the next queued waiter as a release would. It leaves a record of who
// forced it (this Manager's owner id) and why, for forcedRecordTTL, so
// that the evicted holder's next renewal, release or TTL read fails with a
// *ForcedReleaseError (its Done closes, its Context is cancelled with it).
// Every forced release is logged at WARN (who, why, resource, the evicted
// owner; never the token).
//
// It returns nil when it removed a lock, ErrExpired when none was held,
// an error matching ErrNotHeld when the key holds a value that is not a
// shardlock token (it is left alone; so is a read-write lock, which
// ForceRelease does not take apart), and an *InvalidArgumentError for a
// bad resource or an empty, non-printable or too long reason (at most
// MaxReasonLen bytes), before any round trip.
func (m *Manager) ForceRelease(ctx context.Context, resource, reason string) error {
	if err := m.open(); err != nil {
		return err
	}
	if ctx == nil {
		return invalid("context", "nil")
	}
	key, err := m.lockKey(resource)
	if err != nil {
		return err
	}
	if reason == "" || len(reason) > MaxReasonLen || !printable(reason) {
		return invalid("reason", "must be 1 to %d bytes of printable UTF-8", MaxReasonLen)
	}
	var (
		code    int64
		evicted string // the evicted holder's token: only its owner is logged
	)
	err = m.tr.RetryTransient(ctx, time.Time{}, func(ctx context.Context) error {
		res, err := m.tr.RunScript(ctx, m.cmd, scripts.ForceRelease, []string{key}, m.cfg.owner+"|"+reason,
			strconv.FormatInt(forcedRecordTTL.Milliseconds(), 10)).Slice()
		if err == nil && len(res) != 2 {
			err = fmt.Errorf("unexpected reply %v", res)
		}
		if err == nil {
			code, _ = res[0].(int64)
			evicted, _ = res[1].(string)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("shardlock: force release %q: %w", resource, err)
	}
	switch code {
	case scripts.Gone:
		return ErrExpired
	case scripts.NotOurs:
		return fmt.Errorf("shardlock: force release %q: the key holds a value that is not a shardlock token: %w", resource, ErrNotHeld)
	}
	if m.mx != nil {
		m.mx.Class(m.className(resource)).ForceReleased()
	}
	info, _ := ParseToken(evicted)
	m.log.Warn("lock force-released", zap.String("event", "force_released"), zap.String("resource", resource),
		zap.String("by", m.cfg.owner), zap.String("reason", reason), zap.String("evicted_owner", info.Owner),
		zap.Bool("handed_over", code == scripts.HandedOver))
	return nil
}
