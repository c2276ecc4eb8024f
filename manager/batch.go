package manager

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/sharding"
)

// MaxBatch bounds the resources of one batch lock.
const MaxBatch = 128

// ErrCrossSlot is matched by every *CrossSlotError.
var ErrCrossSlot = errors.New("shardlock: batch resources are in different cluster slots")

// CrossSlotError reports batch resources that do not share a slot, found
// before any round trip. Build co-located names with sharding.Group. It
// matches ErrCrossSlot and ErrInvalidArgument.
type CrossSlotError struct {
	Slots map[string]int // resource -> slot
}

func (e *CrossSlotError) Error() string {
	parts := make([]string, 0, len(e.Slots))
	for r, s := range e.Slots {
		parts = append(parts, fmt.Sprintf("%q:%d", r, s))
	}
	sort.Strings(parts)
	return "shardlock: batch resources are in different cluster slots: " + strings.Join(parts, ", ")
}

// Unwrap returns ErrCrossSlot and ErrInvalidArgument.
func (e *CrossSlotError) Unwrap() []error { return []error{ErrCrossSlot, ErrInvalidArgument} }

// BatchHeldError reports the resources of a batch that other owners held
// when the batch was not acquired. It matches ErrNotAcquired.
type BatchHeldError struct {
	Held []string
}

func (e *BatchHeldError) Error() string {
	return fmt.Sprintf("shardlock: lock not acquired: held by others: %s", strings.Join(e.Held, ", "))
}

// Unwrap returns ErrNotAcquired.
func (e *BatchHeldError) Unwrap() error { return ErrNotAcquired }

// BatchReleaseError reports, per resource, why a batch release did not
// delete every key (ErrNotHeld or ErrExpired; resources released cleanly
// are absent). It matches ErrNotHeld when any key was someone else's, else
// ErrExpired.
type BatchReleaseError struct {
	Results map[string]error
}

func (e *BatchReleaseError) Error() string {
	parts := make([]string, 0, len(e.Results))
	for r, err := range e.Results {
		parts = append(parts, fmt.Sprintf("%s: %v", r, err))
	}
	sort.Strings(parts)
	return "shardlock: batch release: " + strings.Join(parts, "; ")
}

// Unwrap returns ErrNotHeld if any resource was someone else's, else ErrExpired.
func (e *BatchReleaseError) Unwrap() error {
	for _, err := range e.Results {
		if errors.Is(err, ErrNotHeld) {
			return ErrNotHeld
		}
	}
	return ErrExpired
}

// batchInfo is what a batch lock holds besides a single lock's fields.
type batchInfo struct {
	resources []string
	keys      []string
	fences    []uint64
}

func (b *batchInfo) heldError(idx []int) error {
	held := make([]string, 0, len(idx))
	for _, i := range idx {
		if i >= 1 && i <= len(b.resources) {
			held = append(held, b.resources[i-1])
		}
	}
	return &BatchHeldError{Held: held}
}

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
	keys, err := m.setKeys("batch", resources)
	if err != nil {
		return nil, err
	}
	ac, _, err := m.acquireConfig(resources[0], opts)
	if err != nil {
		return nil, err
	}
	b := &batchInfo{resources: append([]string(nil), resources...), keys: keys}
	slots := make(map[string]int, len(resources))
	for i, r := range resources {
		slots[r] = sharding.Slot(keys[i])
	}
	for _, r := range resources {
		if slots[r] != slots[resources[0]] {
			return nil, &CrossSlotError{Slots: slots}
		}
	}
	return m.acquireMeasured(ctx, target{resource: resources[0], key: keys[0], batch: b}, &ac, wait)
}

// setKeys checks a set of resources for a batch or multi-slot lock (arg
// names it in errors) and returns their lock keys: 1 to MaxBatch resources,
// each valid, no two naming the same lock ("x" and "{x}" are one lock).
func (m *Manager) setKeys(arg string, resources []string) ([]string, error) {
	if len(resources) == 0 || len(resources) > MaxBatch {
		return nil, invalid(arg, "%d resources, want 1 to %d", len(resources), MaxBatch)
	}
	keys := make([]string, len(resources))
	seen := make(map[string]string, len(resources)) // key -> resource
	for i, r := range resources {
		key, err := m.lockKey(r)
		if err != nil {
			return nil, err
		}
		if first, ok := seen[key]; ok {
			if first == r {
				return nil, invalid("resources", "resource %q appears twice", r)
			}
			return nil, invalid("resources", "resources %q and %q name the same lock %q", first, r, key)
		}
		seen[key] = r
		keys[i] = key
	}
	return keys, nil
}

// batchScriptKeys returns the keys and the fencing argument of
// acquire_batch.lua for b.
func batchScriptKeys(b *batchInfo, fencing bool) ([]string, string) {
	if !fencing {
		return b.keys, luaFlag(false)
	}
	keys := make([]string, 0, 2*len(b.keys))
	keys = append(keys, b.keys...)
	for _, k := range b.keys {
		keys = append(keys, sharding.FenceKey(k))
	}
	return keys, luaFlag(true)
}

// attemptBatch makes one batch acquire round trip; a waiter (mark) marks
// the keys others hold, so that their release announces them free.
func (m *Manager) attemptBatch(ctx context.Context, b *batchInfo, token string, ac *acquireConfig, first, mark bool) (status int, fences []uint64, held []int, replicas int, err error) {
	keys, fencing := batchScriptKeys(b, ac.fencing)
	// A first attempt tries the keys as free before it reads them (the
	// cheapest script when the batch is free); a poll of a batch seen busy
	// reads first.
	try, marks := luaFlag(first), luaFlag(mark)
	var res []any
	if m.cfg.replicas > 0 {
		// The write and WAIT share one connection to the owning master.
		node, err := m.topo.masterFor(ctx, b.keys[0])
		if err != nil {
			return 0, nil, nil, 0, err
		}
		pipe := node.Pipeline()
		acq := scripts.AcquireBatch.Eval(ctx, pipe, keys, token, ac.ttlMs, fencing, try, marks)
		waitc := pipe.Do(ctx, "wait", m.cfg.replicas, m.cfg.replicaTimeout.Milliseconds())
		_, _ = pipe.Exec(ctx)
		if res, err = acq.Slice(); err != nil {
			return 0, nil, nil, 0, err
		}
		if len(res) > 0 && res[0] != scripts.AcquireHeld {
			replicas = m.replicaCount(waitc, "acquire")
		}
	} else if res, err = scripts.AcquireBatch.Run(ctx, m.cmd, keys, token, ac.ttlMs, fencing, try, marks).Slice(); err != nil {
		return 0, nil, nil, 0, err
	}
	status, fences, held, err = parseBatchReply(res, ac.fencing)
	return status, fences, held, replicas, err
}

// parseBatchReply reads acquire_batch.lua's reply.
func parseBatchReply(res []any, fencing bool) (status int, fences []uint64, held []int, err error) {
	if len(res) == 0 {
		return 0, nil, nil, fmt.Errorf("shardlock: unexpected batch acquire reply %v", res)
	}
	st, _ := res[0].(int64)
	ints := make([]int64, 0, len(res)-1)
	for _, v := range res[1:] {
		n, _ := v.(int64)
		ints = append(ints, n)
	}
	if st == scripts.AcquireHeld {
		held = make([]int, len(ints))
		for i, n := range ints {
			held[i] = int(n)
		}
		return attemptContended, nil, held, nil
	}
	if fencing {
		fences = make([]uint64, len(ints))
		for i, n := range ints {
			fences[i] = uint64(n)
		}
	}
	return int(st), fences, nil, nil
}

// Resources returns the resources the lock holds: one, or a batch's.
func (l *Lock) Resources() []string {
	if l == nil {
		return nil
	}
	if l.multi != nil {
		return append([]string(nil), l.multi.resources...)
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
	if l.multi != nil {
		return append([]uint64(nil), l.multi.fences...)
	}
	return []uint64{l.fence}
}
