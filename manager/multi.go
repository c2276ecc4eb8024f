package manager

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/sharding"
)

// MultiLock holds locks on resources in several cluster slots, taken by
// AcquireMulti: one *Lock per slot (a batch where a slot has several
// resources). Its methods are safe for concurrent use and nil-safe.
type MultiLock struct {
	parts []*Lock

	once   sync.Once
	ctx    context.Context
	cancel context.CancelCauseFunc
	stops  []func() bool
}

// Locks returns the per-slot locks, in the order they were taken (slot,
// then key).
func (ml *MultiLock) Locks() []*Lock {
	if ml == nil {
		return nil
	}
	return append([]*Lock(nil), ml.parts...)
}

// Resources returns every resource held.
func (ml *MultiLock) Resources() []string {
	if ml == nil {
		return nil
	}
	var out []string
	for _, l := range ml.parts {
		out = append(out, l.Resources()...)
	}
	return out
}

// Keys returns every lock key held, in the order of Resources.
func (ml *MultiLock) Keys() []string {
	if ml == nil {
		return nil
	}
	var out []string
	for _, l := range ml.parts {
		out = append(out, l.Keys()...)
	}
	return out
}

// Fences returns every resource's fencing token, in the order of
// Resources, or nil when fencing is off.
func (ml *MultiLock) Fences() []uint64 {
	if ml == nil {
		return nil
	}
	var out []uint64
	for _, l := range ml.parts {
		f := l.Fences()
		if f == nil {
			return nil
		}
		out = append(out, f...)
	}
	return out
}

// Done returns a channel closed when Context is cancelled: as soon as a
// part is lost, reaches its max hold, or is released.
func (ml *MultiLock) Done() <-chan struct{} {
	if ml == nil {
		return closedChan
	}
	return ml.Context().Done()
}

// TTL returns the smallest remaining TTL of the parts on the server (see
// Lock.TTL), or the first part's error.
func (ml *MultiLock) TTL(ctx context.Context) (time.Duration, error) {
	if ml == nil {
		return 0, ErrNilLock
	}
	least := time.Duration(-1)
	for _, l := range ml.parts {
		ttl, err := l.TTL(ctx)
		if err != nil {
			return 0, err
		}
		if least < 0 || ttl < least {
			least = ttl
		}
	}
	return max(least, 0), nil
}

// Context returns a context cancelled, with that part's cause, as soon as
// any part's Context is (a part lost, past its max hold, or released).
func (ml *MultiLock) Context() context.Context {
	if ml == nil {
		return (*Lock)(nil).Context()
	}
	ml.once.Do(func() {
		ml.ctx, ml.cancel = context.WithCancelCause(context.Background())
		for _, l := range ml.parts {
			lctx := l.Context()
			if lctx.Err() != nil {
				ml.cancel(context.Cause(lctx)) // already over: at once, not from AfterFunc's goroutine
			}
			ml.stops = append(ml.stops, context.AfterFunc(lctx, func() { ml.cancel(context.Cause(lctx)) }))
		}
	})
	return ml.ctx
}

// Err returns the first part's error (see Lock.Err), or nil.
func (ml *MultiLock) Err() error {
	if ml == nil {
		return ErrNilLock
	}
	for _, l := range ml.parts {
		if err := l.Err(); err != nil {
			return err
		}
	}
	return nil
}

// Release releases every part, with one pipeline per node, and joins the
// parts' errors (each as Lock.Release would return it).
func (ml *MultiLock) Release(ctx context.Context) error {
	if ml == nil {
		return ErrNilLock
	}
	if ctx == nil {
		return invalid("context", "nil")
	}
	if len(ml.parts) == 0 {
		return nil // a zero MultiLock holds nothing
	}
	var validUntil time.Time
	for _, l := range ml.parts {
		if v := l.validUntilNow(); v.After(validUntil) {
			validUntil = v
		}
	}
	_, _ = ml.parts[0].m.releaseLocks(ctx, ml.parts, nil, validUntil)
	var errs []error
	for i := len(ml.parts) - 1; i >= 0; i-- {
		// Released above (or before): this returns its outcome, without a
		// round trip.
		if err := ml.parts[i].Release(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	ml.Context()
	ml.cancel(ErrReleased) // Done is closed when Release returns
	return errors.Join(errs...)
}

// Extend extends every part (each as Lock.Extend) and joins their errors.
func (ml *MultiLock) Extend(ctx context.Context, ttl time.Duration) error {
	if ml == nil {
		return ErrNilLock
	}
	var errs []error
	for _, l := range ml.parts {
		if err := l.Extend(ctx, ttl); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// AcquireMulti locks resources in any slots, all or none. It groups them by
// cluster slot, each group taken as one batch script. It first tries every
// group at once, with one pipeline per node; if one is busy, it keeps the
// groups before it in one fixed global order (slot, then key), gives the
// others back, and goes on in that order, waiting on a busy group as
// AcquireBatch does; when a group cannot be had it releases what it took.
// A caller only ever waits while holding groups that come earlier in the
// order, so two callers with overlapping sets never deadlock. The wait
// limit and ctx bound the whole call.
//
// It returns an *InvalidArgumentError for an empty set, more than MaxBatch
// resources, a duplicate or a bad resource, and otherwise what AcquireBatch
// returns for the group that failed.
func (m *Manager) AcquireMulti(ctx context.Context, resources []string, opts ...AcquireOption) (*MultiLock, error) {
	return m.acquireMulti(ctx, resources, opts, true)
}

// TryAcquireMulti is AcquireMulti without waiting: one attempt at every
// group, one pipeline per node; when any group is busy it gives back the
// others and returns that group's error.
func (m *Manager) TryAcquireMulti(ctx context.Context, resources []string, opts ...AcquireOption) (*MultiLock, error) {
	return m.acquireMulti(ctx, resources, opts, false)
}

func (m *Manager) acquireMulti(ctx context.Context, resources []string, opts []AcquireOption, wait bool) (*MultiLock, error) {
	if err := m.usable(); err != nil {
		return nil, err
	}
	resources, keys, err := m.setKeys("resources", resources)
	if err != nil {
		return nil, err
	}
	groups := slotGroups(resources, keys)
	// One deadline for the whole call: later groups get what is left.
	ac, err := m.acquireOptions(opts)
	if err != nil {
		return nil, err
	}
	if ctx == nil {
		return nil, invalid("context", "nil")
	}
	if wait && ac.wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, ac.wait)
		defer cancel()
	}
	ml := &MultiLock{}
	next := 0
	if m.cfg.replicas == 0 {
		var done bool
		if next, done, err = m.tryAllGroups(ctx, ml, groups, opts, wait, ac.ttl); done {
			return ml, nil
		} else if err != nil {
			return nil, err
		}
	}
	for _, g := range groups[next:] {
		var l *Lock
		if wait {
			l, err = m.AcquireBatch(ctx, g.resources, opts...)
		} else {
			l, err = m.TryAcquireBatch(ctx, g.resources, opts...)
		}
		if err != nil {
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), ac.ttl)
			_ = ml.Release(rctx) // roll back
			rcancel()
			return nil, err
		}
		ml.parts = append(ml.parts, l)
	}
	return ml, nil
}

// slotGroups sorts resources (with their keys) in the global order, by slot
// and then by key, and groups them by slot.
func slotGroups(resources, keys []string) []*batchInfo {
	type item struct {
		resource, key string
		slot          int
	}
	items := make([]item, 0, len(resources))
	for i, r := range resources {
		items = append(items, item{r, keys[i], sharding.Slot(keys[i])})
	}
	sort.Slice(items, func(i, j int) bool {
		if items[i].slot != items[j].slot {
			return items[i].slot < items[j].slot
		}
		return items[i].key < items[j].key
	})
	var groups []*batchInfo // resources and keys of one slot each, in order
	for i, it := range items {
		if i == 0 || it.slot != items[i-1].slot {
			groups = append(groups, &batchInfo{})
		}
		g := groups[len(groups)-1]
		g.resources, g.keys = append(g.resources, it.resource), append(g.keys, it.key)
	}
	return groups
}

// tryAllGroups makes one attempt at every group at once, one pipeline per
// node (tryGroups), into ml. With every group taken it is done. Else the
// groups before the first one not taken are kept, as the ordered walk would
// hold them while it waits for that one (unless the call does not wait),
// the others are given back (within ttl), and the walk goes on from next;
// err is the first failure when the call does not wait on.
func (m *Manager) tryAllGroups(ctx context.Context, ml *MultiLock, groups []*batchInfo, opts []AcquireOption, wait bool, ttl time.Duration) (next int, done bool, err error) {
	parts, first, ferr := m.tryGroups(ctx, groups, opts)
	if first == len(groups) {
		ml.parts = parts
		return 0, true, nil
	}
	var drop []*Lock
	for _, l := range parts[first:] {
		if l != nil {
			drop = append(drop, l)
		}
	}
	ml.parts = parts[:first]
	stop := !wait || m.closed.Load()
	if stop {
		drop = append(drop, ml.parts...)
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), ttl)
	_, _ = m.releaseLocks(rctx, drop, nil, time.Time{})
	rcancel()
	if stop {
		return 0, false, ferr
	}
	return first, false, nil
}

// tryGroups makes one attempt at every group (resources of one slot each,
// in the global order) in one pipeline per node. It returns the lock taken
// for each group (nil where none was), the index of the first group not
// taken (len(groups) when all were), and that group's error.
func (m *Manager) tryGroups(ctx context.Context, groups []*batchInfo, opts []AcquireOption) ([]*Lock, int, error) {
	if m.closed.Load() {
		return make([]*Lock, len(groups)), 0, ErrClosed
	}
	start := time.Now()
	base, err := m.acquireOptions(opts)
	if err != nil {
		return make([]*Lock, len(groups)), 0, err
	}
	atts := make([]groupAttempt, len(groups))
	calls := make([]transport.ScriptCall, len(groups))
	for i, b := range groups {
		ac := base // each group its own metrics class
		m.resolveClass(&ac, b.resources[0])
		atts[i] = groupAttempt{b: b, ac: ac, token: newToken(m.cfg.owner, start)}
		keys, fencing := batchScriptKeys(b, ac.fencing)
		calls[i] = transport.ScriptCall{Script: scripts.AcquireBatch, Keys: keys, Args: []any{atts[i].token, ac.ttlMs, fencing, luaTrue, luaFalse}}
	}
	sentAt := time.Now()
	if err := m.tr.Bounded(ctx, time.Time{}, func(ctx context.Context) error {
		transport.RunBatch(ctx, m.client, calls)
		return nil
	}, func(error) {
		// The caller has gone: whatever the attempts took is released.
		for _, a := range atts {
			a.orphan(m, sentAt.Add(a.ac.ttl))
		}
	}); err != nil {
		return make([]*Lock, len(groups)), 0, errors.Join(ErrNotAcquired, err)
	}
	locks := make([]*Lock, len(groups))
	first, firstErr := len(groups), error(nil)
	for i := range atts {
		a := &atts[i]
		l, err := m.groupResult(a, calls[i].Cmd, start, sentAt)
		if err == nil {
			locks[i] = l
			if a.ac.cls != nil {
				a.ac.cls.Acquired(time.Since(start))
			}
			continue
		}
		if i < first {
			// Only the first failure is the call's outcome (the others
			// are retried or given back).
			if a.ac.cls != nil {
				a.ac.cls.AcquireFailed(time.Since(start), acquireReason(err, false))
			}
			first, firstErr = i, err
		}
	}
	return locks, first, firstErr
}

// groupAttempt is tryGroups' attempt at one group.
type groupAttempt struct {
	b     *batchInfo
	ac    acquireConfig
	token string
}

// orphan hands a's token, which may hold the group's keys until deadline,
// to the reaper.
func (a *groupAttempt) orphan(m *Manager, deadline time.Time) {
	for _, k := range a.b.keys {
		m.reap(k, a.token, kindBatch.perKey(), deadline)
	}
}

// groupResult makes the Lock of a group's attempt (sent at sentAt, in a
// call that began at start) from its reply, or says why there is none.
func (m *Manager) groupResult(a *groupAttempt, cmd *redis.Cmd, start, sentAt time.Time) (*Lock, error) {
	res, err := cmd.Result()
	var (
		status int
		fences []uint64
		held   []int
	)
	if err == nil {
		status, fences, held, err = parseBatchReply(res, a.ac.fencing)
	}
	switch {
	case err != nil:
		if transport.IsAmbiguous(err) || transport.RanWithError(err) {
			// It may still run on the server, or have written before it
			// failed: its token goes to the reaper.
			a.orphan(m, sentAt.Add(a.ac.ttl))
		}
		return nil, fmt.Errorf("shardlock: acquire %q: %w", a.b.resources[0], err)
	case status == attemptContended:
		return nil, a.b.heldError(held)
	}
	l := m.newLock(kindBatch, a.b.resources[0], a.b.keys[0], a.token, a.token, 0, start, sentAt, &a.ac)
	l.batch = &batchInfo{resources: a.b.resources, keys: a.b.keys, fences: fences}
	if len(fences) > 0 {
		l.fence = fences[0]
	}
	if !monoNow().Before(l.validUntil) {
		// The reply came after the lock would have expired.
		a.orphan(m, l.validUntil.Time())
		return nil, ErrNotAcquired
	}
	if !m.sched.add(l) {
		l.releaseNow()
		return nil, ErrClosed
	}
	return l, nil
}
