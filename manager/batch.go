package manager

import (
	"context"

	"github.com/shardlock/shardlock/sharding"
)

// MaxBatch bounds the resources of one batch lock.
const MaxBatch = 128

// TryAcquireBatch makes one attempt to lock every resource, all or none, in
// one script. The resources must share a cluster slot (build them with
// sharding.Group); the lock releases, extends and renews them together, and
// is lost as a whole if any key is lost.
//
// It returns a *BatchHeldError (matching ErrNotAcquired) naming the
// resources others hold, a *CrossSlotError for resources in different
// slots, an *InvalidArgumentError for an empty batch, more than MaxBatch
// resources, a duplicate or a bad resource, and otherwise what TryAcquire
// returns.
func (m *Manager) TryAcquireBatch(ctx context.Context, resources []string, opts ...AcquireOption) (*Lock, error) {
	return m.acquireBatch(ctx, resources, opts, false)
}

// AcquireBatch is TryAcquireBatch that waits as Acquire does, but without
// queueing: it marks the keys others hold and tries again when a release
// announces one free, or on the retry strategy's timer (WithNotifications).
func (m *Manager) AcquireBatch(ctx context.Context, resources []string, opts ...AcquireOption) (*Lock, error) {
	return m.acquireBatch(ctx, resources, opts, true)
}

func (m *Manager) acquireBatch(ctx context.Context, resources []string, opts []AcquireOption, wait bool) (*Lock, error) {
	if err := m.usable(); err != nil {
		return nil, err
	}
	resources, keys, err := m.setKeys("batch", resources)
	if err != nil {
		return nil, err
	}
	ac, err := m.acquireOptions(opts)
	if err != nil {
		return nil, err
	}
	if !oneSlot(m.cfg.prefix, keys) {
		slots := make(map[string]int, len(resources))
		for i, r := range resources {
			slots[r] = sharding.Slot(keys[i])
		}
		return nil, &CrossSlotError{Slots: slots}
	}
	b := &batchInfo{resources: resources, keys: keys}
	kind := kindBatch
	if !ac.fencing && m.msetex.Load() {
		kind = kindBatchNative
	}
	return m.acquireMeasured(ctx, target{kind: kind, resource: resources[0], key: keys[0], batch: b}, &ac, wait)
}

// oneSlot reports whether keys, lock keys under prefix, share a cluster
// slot. Keys with the same hash tag do (the usual batch, built with
// sharding.Group), which needs no CRC; other tags are compared by slot.
func oneSlot(prefix string, keys []string) bool {
	tag, _ := sharding.HashTag(keys[0])
	slot := -1
	for _, k := range keys[1:] {
		if hasTag(k, len(prefix), tag) {
			continue
		}
		if slot < 0 {
			slot = sharding.Slot(keys[0])
		}
		if sharding.Slot(k) != slot {
			return false
		}
	}
	return true
}

// hasTag reports whether lock key k, whose resource starts at offset off
// (the prefix, which has no braces, before it), has the hash tag tag, by
// looking for "{tag}" at off: the first '{' of k is there, and a tag holds
// no '}'. (A k without "{tag}" there may still have tag: oneSlot then
// compares slots.)
func hasTag(k string, off int, tag string) bool {
	end := off + 1 + len(tag)
	return len(k) > end && k[off] == '{' && k[end] == '}' && k[off+1:end] == tag
}

// setKeys checks a set of resources for a batch or multi-slot lock (arg
// names it in errors) and returns a copy of them and their lock keys, in
// one slice: 1 to MaxBatch resources, each valid, no two naming the same
// lock ("x" and "{x}" are one lock).
func (m *Manager) setKeys(arg string, resources []string) (copied, keys []string, err error) {
	n := len(resources)
	if n == 0 || n > MaxBatch {
		return nil, nil, invalid(arg, "%d resources, want 1 to %d", n, MaxBatch)
	}
	both := make([]string, n, 2*n)
	copy(both, resources)
	copied = both[:n:n]
	if keys, err = m.lockKeys(both[n:n], copied); err != nil {
		return nil, nil, err
	}
	var seen map[string]int // key -> index, for large sets; small ones are scanned
	if n > scanDuplicatesUpTo {
		seen = make(map[string]int, n)
	}
	for i, key := range keys {
		j := -1
		if seen != nil {
			if k, dup := seen[key]; dup {
				j = k
			}
			seen[key] = i
		} else {
			j = indexKey(keys[:i], key)
		}
		if j >= 0 {
			if copied[j] == copied[i] {
				return nil, nil, invalid("resources", "resource %q appears twice", copied[i])
			}
			return nil, nil, invalid("resources", "resources %q and %q name the same lock %q", copied[j], copied[i], key)
		}
	}
	return copied, keys, nil
}

// indexKey is slices.Index for the keys of one set, which share their
// start (the prefix and, in a batch, the tag): it compares the last byte
// before the whole key.
func indexKey(keys []string, key string) int {
	last := key[len(key)-1] // a lock key is never empty
	for i, k := range keys {
		if len(k) == len(key) && k[len(k)-1] == last && k == key {
			return i
		}
	}
	return -1
}

// scanDuplicatesUpTo is the largest set whose keys setKeys compares one by
// one rather than through a map (cheaper for the usual few keys).
const scanDuplicatesUpTo = 16

// Resources returns the resources the lock holds: one, or a batch's.
func (l *Lock) Resources() []string {
	if l == nil {
		return nil
	}
	if l.batch != nil {
		return append([]string(nil), l.batch.resources...)
	}
	return []string{l.resource}
}

// Keys returns the Redis keys the lock holds.
func (l *Lock) Keys() []string {
	if l == nil {
		return nil
	}
	return append([]string(nil), l.scriptKeys()...)
}

// Fences returns the fencing token of each resource (see Resources), or nil
// when fencing is off.
func (l *Lock) Fences() []uint64 {
	if l == nil || l.fence == 0 {
		return nil
	}
	if l.batch != nil {
		return append([]uint64(nil), l.batch.fences...)
	}
	return []uint64{l.fence}
}
