package manager

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/metrics"
	"github.com/shardlock/shardlock/sharding"
)

// zero reports whether l is nil or a Lock not made by a Manager.
func (l *Lock) zero() bool { return l == nil || l.m == nil }

func (l *Lock) sigLocked() *lockSignals {
	if l.sig == nil {
		l.sig = &lockSignals{}
	}
	return l.sig
}

// drift is the safety margin taken off a TTL for the difference between the
// server's clock and ours (as redsync and the Redlock paper do).
func drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// newLock makes the Lock of a successful acquire. tokenArg is token boxed
// as an interface (shared with the acquire's command, so it is boxed once).
func (m *Manager) newLock(kind lockKind, resource, key, token string, tokenArg any, fence uint64, acquiredAt, validFrom time.Time, ac *acquireConfig) *Lock {
	a := &lockAndWatch{
		l: Lock{
			m: m, kind: kind, resource: resource, key: key, token: token, fence: fence, acquiredAt: acquiredAt,
			keys: [1]string{key}, args: [1]any{tokenArg}, cls: ac.cls,
			ttl: ac.ttl, validUntil: monoOf(validFrom).Add(ac.ttl - drift(ac.ttl)),
		},
		w: watch{
			rn: renewState{interval: ac.interval, fixedInterval: m.cfg.renewInterval > 0, watchdog: ac.watchdog,
				lastSent: monoOf(validFrom), next: monoOf(validFrom).Add(ac.interval)},
			wd: watchEntry{idx: idxNone},
		},
	}
	if ac.maxHold > 0 {
		a.w.rn.maxHoldAt = monoOf(acquiredAt).Add(ac.maxHold)
	}
	a.l.w = &a.w
	return &a.l
}

// lockAndWatch is a Lock and its watchdog entry in one allocation.
type lockAndWatch struct {
	l Lock
	w watch
}

// claimValidity is how long a lock taken on the claim lease is valid by
// this process's clock, from the earliest time it can have been handed over.
const claimValidity = scripts.ClaimLease - 2*time.Millisecond

// claimConfirmMargin is how much of a claim lease's validity is left when
// the lease's confirmation is sent: three quarters of the lease, more than
// a pause of the holder's process (a GC, a CPU quota period of 100 ms)
// usually lasts.
const claimConfirmMargin = 3 * scripts.ClaimLease / 4

// onClaim makes l, not shared yet, a lock handed over on the claim lease
// from validFrom: valid for the lease, its first renewal (the confirmation)
// due when claimConfirmMargin of it is left, or at once if less is. A lock
// released before then sends no confirmation, which spares the short
// critical sections of a contended resource a round trip; one released
// while its confirmation is in flight cancels nothing: the renewal then
// finds the key released and is ignored.
func (l *Lock) onClaim(validFrom time.Time) {
	l.w.rn.claimed = true
	l.validUntil = monoOf(validFrom).Add(min(claimValidity, l.ttl-drift(l.ttl)))
	l.w.rn.next = max(monoOf(validFrom), l.validUntil.Add(-claimConfirmMargin))
}

// takeOver makes l, not shared yet, a lock handed over in this process
// (localQueues.transfer): valid until validUntil, the validity of the lock
// it takes over, whose key and TTL it keeps; on a claim lease its
// confirmation is due as onClaim has it, counted from that validity.
func (l *Lock) takeOver(validUntil mono) {
	l.validUntil = validUntil
	if l.w.rn.claimed {
		l.w.rn.next = max(monoNow(), validUntil.Add(-claimConfirmMargin))
	}
}

// Resource returns the resource name the lock was taken on.
func (l *Lock) Resource() string {
	if l == nil {
		return ""
	}
	return l.resource
}

// Key returns the Redis key that holds the lock.
func (l *Lock) Key() string {
	if l == nil {
		return ""
	}
	return l.key
}

// Token returns the lock's token. Whoever knows it can release the lock:
// treat it as a secret (shardlock never logs it whole). A lock without
// fencing that a release hands to the next waiter of the same Manager
// keeps its token: the new holder takes the key over as it is, without a
// round trip (a token passes on for at most 10 s after it was made). Use
// Fence, not the token, to tell holders apart.
func (l *Lock) Token() string {
	if l == nil {
		return ""
	}
	return l.token
}

// Fence returns the lock's fencing token, strictly increasing per resource
// across acquisitions, or 0 when fencing is off. Pass it to the resource the
// lock protects and have it reject writes with a smaller fence.
func (l *Lock) Fence() uint64 {
	if l == nil {
		return 0
	}
	return l.fence
}

// AcquiredAt returns when the acquire that returned the lock started.
func (l *Lock) AcquiredAt() time.Time {
	if l == nil {
		return time.Time{}
	}
	return l.acquiredAt
}

// Replicas returns how many replicas acknowledged the acquire under
// WithReplicaAck (0 without it).
func (l *Lock) Replicas() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.replicas
}

// Done returns a channel closed when the lock is released or lost.
func (l *Lock) Done() <-chan struct{} {
	if l.zero() {
		return closedChan
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.finished {
		return closedChan
	}
	sig := l.sigLocked()
	if sig.done == nil {
		sig.done = make(chan struct{})
	}
	return sig.done
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Context returns a context cancelled when the lock is lost (cause: an
// error matching ErrLockLost), reaches its max hold (cause
// ErrMaxHoldExceeded) or is released (cause ErrReleased). Run the work the
// lock protects under it.
func (l *Lock) Context() context.Context {
	if l.zero() {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(ErrNilLock)
		return ctx
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	sig := l.sigLocked()
	if sig.ctx == nil {
		sig.ctx, sig.cancel = context.WithCancelCause(context.Background())
		if l.cause != nil {
			sig.cancel(l.cause)
		}
	}
	return sig.ctx
}

// endLocked cancels the Context with cause (unless already cancelled) and,
// when finish is set, closes Done. l.mu must be held.
func (l *Lock) endLocked(cause error, finish bool) {
	if l.cause == nil {
		l.cause = cause
		if l.sig != nil && l.sig.cancel != nil {
			l.sig.cancel(cause)
		}
	}
	if finish && !l.finished {
		l.finished = true
		if l.sig != nil && l.sig.done != nil {
			close(l.sig.done)
		}
	}
}

// Err returns why Done closed: nil while the lock is held and after a clean
// release; an error matching ErrLockLost and its reason (ErrNotHeld,
// ErrExpired, which includes a validity that ran out with no successful
// renewal, or ErrMaxHoldExceeded) when it was lost; the release's error
// when a release failed.
func (l *Lock) Err() error {
	if l.zero() {
		return ErrNilLock
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *Lock) ttlNow() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ttl
}

func (l *Lock) validUntilNow() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil.Time()
}

// heldErr returns nil while the lock is held, else why not.
func (l *Lock) heldErrLocked() error {
	switch l.state {
	case stateHeld:
		return nil
	case stateLost:
		return l.err
	}
	return ErrReleased
}

// markLost records that the lock is gone for cause, once: it cancels the
// Context, closes Done and logs one line. It reports whether it did.
func (l *Lock) markLost(cause error) bool {
	l.mu.Lock()
	if l.state != stateHeld {
		l.mu.Unlock()
		return false
	}
	l.state = stateLost
	l.err = lost(cause)
	err, watched := l.err, l.w.rn.watched
	l.mu.Unlock()
	if l.cls != nil {
		l.cls.Lost(time.Since(l.acquiredAt), lostReason(cause))
	}
	defer func() {
		l.mu.Lock()
		l.endLocked(err, true)
		l.mu.Unlock()
	}()
	if watched {
		l.m.sched.remove(l)
	}
	l.m.queues.holderGone(l)
	if errors.Is(cause, ErrMaxHoldExceeded) {
		l.m.log.Warn("lock expired after max hold", l.m.fields(context.Background(), "lost", l, zap.Error(err))...)
	} else {
		l.m.log.Error("lock lost", l.m.fields(context.Background(), "lost", l, zap.Error(err))...)
	}
	return true
}

// releaseErrLocked returns what the finished release returned.
func (l *Lock) releaseErrLocked() error {
	var le *lostError
	if errors.As(l.err, &le) {
		return le.cause
	}
	return l.err
}

// outcomeReason is the metrics reason of a release or renewal result.
func outcomeReason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrForceReleased):
		return metrics.ReasonForced
	case errors.Is(err, ErrNotHeld):
		return metrics.ReasonNotHeld
	case errors.Is(err, ErrExpired):
		return metrics.ReasonExpired
	}
	return metrics.ReasonRedisError
}

// lostReason is the metrics reason of a loss.
func lostReason(cause error) string {
	var ve *validityError
	switch {
	case errors.As(cause, &ve):
		return metrics.ReasonValidity // before ErrExpired, which it matches
	case errors.Is(cause, ErrMaxHoldExceeded):
		return metrics.ReasonMaxHold
	case errors.Is(cause, ErrForceReleased):
		return metrics.ReasonForced
	case errors.Is(cause, ErrNotHeld):
		return metrics.ReasonNotHeld
	case errors.Is(cause, ErrExpired):
		return metrics.ReasonExpired
	}
	return metrics.ReasonValidity
}

// Extend sets the lock's TTL to ttl from now with one compare-and-pexpire,
// and makes ttl the TTL the watchdog renews to. It never re-creates a key
// that has gone: then it returns ErrExpired (or ErrNotHeld when another
// owner holds the key) and the lock is lost. It returns an
// *InvalidArgumentError for a ttl outside [MinTTL, MaxTTL], and an error
// matching ErrLockLost or ErrReleased when the lock is no longer held, and
// ctx's error, with nothing sent, when ctx has already ended. Transient
// errors are retried while ctx lasts and the lock is valid.
func (l *Lock) Extend(ctx context.Context, ttl time.Duration) error {
	if l.zero() {
		return ErrNilLock
	}
	if ctx == nil {
		return invalid("context", "nil")
	}
	m := l.m
	if err := checkTTL(ttl); err != nil {
		return err
	}
	l.mu.Lock()
	if l.w.rn.fixedInterval && l.w.rn.interval >= ttl {
		l.mu.Unlock()
		return invalid("ttl", "%v must exceed the renew interval %v", ttl, l.w.rn.interval)
	}
	if err := l.heldErrLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	validUntil := l.validUntil.Time()
	l.mu.Unlock()
	if m.cfg.replicas > 0 && m.cfg.replicaTimeout >= ttl {
		return invalid("ttl", "%v must exceed the replica ack timeout %v", ttl, m.cfg.replicaTimeout)
	}

	ttlMs := strconv.FormatInt(ttl.Milliseconds(), 10)
	var (
		r        int64
		replicas = -1
		sentAt   time.Time
	)
	err := m.tr.RetryTransient(ctx, validUntil, func(ctx context.Context) error {
		sentAt = time.Now()
		var err error
		if m.cfg.replicas > 0 {
			var out extendOut
			out, err = transport.Exchange(m.tr, ctx, time.Time{}, func(ctx context.Context) (extendOut, error) {
				r, n, err := m.extendWait(ctx, l, ttlMs)
				return extendOut{r, n}, err
			}, nil)
			r, replicas = out.r, out.replicas
		} else {
			r, err = l.kind.extend(m, ctx, l, ttlMs)
		}
		return err
	})
	if err != nil {
		l.cls.Renewed(metrics.ReasonRedisError)
		return fmt.Errorf("shardlock: extend: %w", err)
	}
	if cause := l.heldCause(r); cause != nil {
		err := l.lostTo(cause)
		if err != ErrReleased {
			l.cls.Renewed(outcomeReason(cause))
		}
		return err
	}
	l.cls.Renewed("")
	l.renewed(sentAt, ttl)
	if replicas >= 0 {
		l.mu.Lock()
		l.replicas = replicas
		l.mu.Unlock()
		if replicas < m.cfg.replicas && m.cfg.replicaPolicy == ReplicaFail {
			return &ReplicaAckError{Want: m.cfg.replicas, Got: replicas}
		}
	}
	return nil
}

type extendOut struct {
	r        int64
	replicas int
}

// extendWait runs the extend script and WAIT in one pipeline on the owning master.
func (m *Manager) extendWait(ctx context.Context, l *Lock, ttlMs string) (int64, int, error) {
	c := l.kind.extendCall(l.scriptKeys(), l.args[0], ttlMs)
	ext, wait, err := m.evalWithWait(ctx, l.key, c.Script, c.Keys, c.Args...)
	if err != nil {
		return 0, 0, err
	}
	r, err := ext.Int64()
	if err != nil {
		return 0, 0, err
	}
	if r != scripts.Done {
		return r, 0, nil // nothing was written: no WAIT to read
	}
	return r, m.replicaCount(wait, "extend"), nil
}

// renewed records a successful write of the key's TTL (ttl, sent at
// sentAt) and reschedules the lock. An older write than one already
// recorded changes nothing.
func (l *Lock) renewed(sentAtTime time.Time, ttl time.Duration) {
	sentAt := monoOf(sentAtTime)
	l.mu.Lock()
	if l.state != stateHeld || sentAt.Before(l.w.rn.lastSent) {
		l.mu.Unlock()
		return
	}
	l.w.rn.lastSent = sentAt
	l.ttl = ttl
	if !l.w.rn.fixedInterval {
		l.w.rn.interval = ttl / 3
	}
	l.validUntil = sentAt.Add(ttl - drift(ttl))
	l.w.rn.next = sentAt.Add(l.w.rn.interval)
	l.w.rn.fails = 0
	l.w.rn.claimed = false
	due, slack := l.nextDueLocked()
	l.mu.Unlock()
	l.m.sched.schedule(l, due, slack)
}

// TTL returns the lock's remaining TTL on the server. It returns ErrExpired
// or ErrNotHeld (and the lock is lost) when the key is gone or owned by
// someone else; without a round trip, the lock's error (matching
// ErrLockLost) when it is already known lost and ErrReleased after a
// release; and ctx's error, with nothing sent, when ctx has already ended.
func (l *Lock) TTL(ctx context.Context) (time.Duration, error) {
	if l.zero() {
		return 0, ErrNilLock
	}
	if ctx == nil {
		return 0, invalid("context", "nil")
	}
	l.mu.Lock()
	err := l.heldErrLocked()
	l.mu.Unlock()
	if err != nil {
		return 0, err
	}
	c := l.kind.pttlCall(l.scriptKeys(), l.args[:])
	res, err := l.m.tr.RunScript(ctx, l.m.cmd, c.Script, c.Keys, c.Args...).Int64Slice()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("unexpected reply %v", res)
	}
	if err != nil {
		return 0, fmt.Errorf("shardlock: ttl: %w", err)
	}
	if cause := l.heldCause(res[0]); cause != nil {
		return 0, l.lostTo(cause)
	}
	return time.Duration(res[1]) * time.Millisecond, nil
}

// heldCause reads status, a script's answer about l's key (scripts.Done
// and the rest), as the error of a lock no longer held, or nil.
func (l *Lock) heldCause(status int64) error {
	switch status {
	case scripts.Gone:
		return ErrExpired
	case scripts.Forced:
		return l.m.forcedError(l.key, l.token)
	case scripts.NotOurs:
		return ErrNotHeld
	}
	return nil
}

// lostTo marks l lost for cause, found by a call on the lock (Extend,
// TTL), and returns the call's error: cause, or ErrReleased when the
// holder's own Release took the lock first (the call raced it).
func (l *Lock) lostTo(cause error) error {
	if l.markLost(cause) {
		return cause
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == stateLost {
		return cause
	}
	return ErrReleased
}

// scriptKeys are the keys l's scripts take: its key, or a batch's keys.
func (l *Lock) scriptKeys() []string {
	if l.batch != nil {
		return l.batch.keys
	}
	return l.keys[:]
}

// forcedError reads the record a forced release left beside key for
// token, to say who forced it and why (best effort: bounded, and plain
// ErrForceReleased when the record cannot be read).
func (m *Manager) forcedError(key, token string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rec, err := m.client.Get(ctx, sharding.ForcedKey(key)).Result()
	if err != nil {
		return &ForcedReleaseError{}
	}
	rest, ok := strings.CutPrefix(rec, token+"=")
	if !ok {
		return &ForcedReleaseError{}
	}
	by, why, _ := strings.Cut(rest, "|")
	return &ForcedReleaseError{By: by, Reason: why}
}
