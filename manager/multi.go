package manager

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

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

// Release releases every part (each as Lock.Release) and joins their errors.
func (ml *MultiLock) Release(ctx context.Context) error {
	if ml == nil {
		return ErrNilLock
	}
	var errs []error
	for i := len(ml.parts) - 1; i >= 0; i-- {
		if err := ml.parts[i].Release(ctx); err != nil {
			errs = append(errs, err)
		}
	}
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
// cluster slot and takes the groups in one fixed global order (slot, then
// key), each group as one batch script, waiting on a busy group as
// AcquireBatch does; when a group cannot be had it releases what it took,
// in reverse order. Two callers with overlapping sets therefore never
// deadlock. The wait limit and ctx bound the whole call.
//
// It returns an *InvalidArgumentError for an empty set, more than MaxBatch
// resources, a duplicate or a bad resource, and otherwise what AcquireBatch
// returns for the group that failed.
func (m *Manager) AcquireMulti(ctx context.Context, resources []string, opts ...AcquireOption) (*MultiLock, error) {
	return m.acquireMulti(ctx, resources, opts, true)
}

// TryAcquireMulti is AcquireMulti without waiting: one attempt per group.
func (m *Manager) TryAcquireMulti(ctx context.Context, resources []string, opts ...AcquireOption) (*MultiLock, error) {
	return m.acquireMulti(ctx, resources, opts, false)
}

func (m *Manager) acquireMulti(ctx context.Context, resources []string, opts []AcquireOption, wait bool) (*MultiLock, error) {
	if len(resources) == 0 || len(resources) > MaxBatch {
		return nil, invalid("resources", "%d resources, want 1 to %d", len(resources), MaxBatch)
	}
	type item struct {
		resource, key string
		slot          int
	}
	items := make([]item, 0, len(resources))
	seen := make(map[string]bool, len(resources))
	for _, r := range resources {
		if seen[r] {
			return nil, invalid("resources", "resource %q appears twice", r)
		}
		seen[r] = true
		if len(r) > MaxResourceLen {
			return nil, invalid("resource", "%d bytes, more than %d", len(r), MaxResourceLen)
		}
		key, err := sharding.LockKey(m.cfg.prefix, r)
		if err != nil {
			return nil, invalid("resource", "%q: %v", r, err)
		}
		items = append(items, item{r, key, sharding.Slot(key)})
	}
	sort.Slice(items, func(i, j int) bool {
		if items[i].slot != items[j].slot {
			return items[i].slot < items[j].slot
		}
		return items[i].key < items[j].key
	})
	var groups [][]string
	for i, it := range items {
		if i == 0 || it.slot != items[i-1].slot {
			groups = append(groups, nil)
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], it.resource)
	}
	// One deadline for the whole call: later groups get what is left.
	ac, _, err := m.acquireConfig(items[0].resource, opts)
	if err != nil {
		return nil, err
	}
	if ctx == nil {
		return nil, invalid("context", "nil")
	}
	ctx, cancel := context.WithTimeout(ctx, ac.wait)
	defer cancel()
	ml := &MultiLock{}
	for _, g := range groups {
		var l *Lock
		if wait {
			l, err = m.AcquireBatch(ctx, g, opts...)
		} else {
			l, err = m.TryAcquireBatch(ctx, g, opts...)
		}
		if err != nil {
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), ac.ttl)
			_ = ml.Release(rctx) // roll back, newest first
			rcancel()
			return nil, err
		}
		ml.parts = append(ml.parts, l)
	}
	return ml, nil
}
