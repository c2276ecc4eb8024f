package manager

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
)

// The seam between the engine and the kinds of lock.
//
// A lockKind is one kind of lock, spoken to the server one way: an
// exclusive lock (kind_exclusive.go), a read-write lock's reader or writer
// (kind_rw.go), a batch of keys in one slot (kind_batch.go). It holds
// everything that differs between kinds: how an acquire attempt is made,
// how a waiting acquire waits, the calls that act on a held lock and how
// their replies read. The engine's rooms (the acquirer, the queue, the
// watchdog, release and the reaper) ask a lock's kind for these and never
// which kind it is.
//
// A new kind, or a second way of speaking to the server for one (the
// conditional commands of newer servers in place of a script, say), is a
// type that implements lockKind in a file of its own; the call that
// acquires locks of that kind names its value (Acquire names kindExclusive,
// RLock kindReader, AcquireBatch kindBatch), and every lock and orphaned token
// carries its kind from then on.
type lockKind interface {
	// attempt makes one acquire attempt of a (a.fw set: a fair waiter's,
	// its entry queued or re-checked). a comes by value: through an
	// interface, a pointer would cost every attempt an allocation.
	attempt(m *Manager, ctx context.Context, a attemptArgs) (attemptResult, error)
	// queues reports whether a waiting acquire queues up, in this process
	// (localQueues) and then in Redis's fair queue; one that does not
	// watches the keys it found held (the batch watch).
	queues() bool
	// fenced reports whether the kind takes a fence when fencing is on.
	fenced() bool
	// holdsReaders reports whether a waiting acquire that polls holds new
	// readers back until its next poll (a read-write lock's writer).
	holdsReaders() bool
	// handsOver reports whether a release hands the lock to this
	// process's next waiter (queued in the release call, or transferred
	// without a round trip).
	handsOver() bool
	// queueMark is the kind field of a fair-queue entry (see
	// fairWaiter.makeEntry), given the fencing flag.
	queueMark(fencing bool) string
	// leave takes entry out of key's queue in Redis, and reports whether
	// it was there.
	leave(m *Manager, ctx context.Context, key, entry string) (bool, error)
	// perKey is the kind whose release frees one key of a lock of this
	// kind: the reaper releases an orphaned token key by key.
	perKey() lockKind

	// releaseCall is the call that releases token ({token}, boxed once)
	// from keys; with entry set, it also queues that entry of this
	// process's next waiter, or hands it the lock (local), as the
	// hand-over goes (handsOver kinds only).
	releaseCall(keys []string, token []any, entry string, local bool) transport.ScriptCall
	// releaseResult reads the reply of l's release call (sent at sentAt;
	// ambiguous: an earlier try's reply was lost) as the release's result
	// for its caller, with the hand-over's code and fence (release.lua's,
	// zero where the kind hands nothing over), or the Redis error to retry
	// or report.
	releaseResult(l *Lock, cmd *redis.Cmd, ambiguous bool, sentAt, validUntil time.Time) (result error, code int64, fence uint64, err error)
	// extendCall sets the TTL of token's keys to ttlMs; its reply is a
	// status (scripts.Done, Gone, NotOurs, Forced).
	extendCall(keys []string, token any, ttlMs string) transport.ScriptCall
	// pttlCall reads the keys' TTL; its reply is {status, ms}.
	pttlCall(keys []string, token []any) transport.ScriptCall

	// release and extend make one release or extend of l on its own
	// (Lock.Release, Lock.Extend), as releaseCall with releaseResult and
	// extendCall do; a second protocol may send other commands here, with
	// those calls as its fallback. The calls above are what goes into
	// pipelines (the watchdog's renewals, Close's releases).
	release(m *Manager, ctx context.Context, l *Lock, entry string, local, ambiguous bool, sentAt, validUntil time.Time) (result error, code int64, fence uint64, err error)
	extend(m *Manager, ctx context.Context, l *Lock, ttlMs string) (status int64, err error)
}

// target is what an acquire locks: one resource, or a batch in one slot.
type target struct {
	kind          lockKind
	resource, key string     // the first (or only) resource and its key
	batch         *batchInfo // a batch's resources and keys; nil for one resource
}

// keys returns the keys tg's attempts may take.
func (tg target) keys() []string {
	if tg.batch != nil {
		return tg.batch.keys
	}
	return []string{tg.key}
}

// An acquire attempt's status: the acquire scripts' (scripts.AcquireHeld,
// AcquireSet, AcquireOurs), which the plain SET NX paths give too.
const (
	attemptContended = int(scripts.AcquireHeld) // someone else holds the key
	attemptFresh     = int(scripts.AcquireSet)  // this attempt set the key
	attemptReplay    = int(scripts.AcquireOurs) // the key already held our token: an earlier attempt (or a re-send) set it
)

// attemptResult is what one acquire attempt learned.
type attemptResult struct {
	status   int // attemptContended, attemptFresh or attemptReplay
	replicas int
	fence    uint64
	fences   []uint64 // a batch's
	held     []int    // a contended batch's: indices of the keys others hold (1-based)
	claimed  bool     // handed over on the claim lease (see queue.go)
	// validUntil: a lock handed over in this process (transfer) keeps the
	// validity of the lock that released it; zero otherwise.
	validUntil mono
}

// attemptArgs is one acquire attempt: a fair waiter's (fw set), a single
// lock's or a batch's.
type attemptArgs struct {
	tg                  target
	token               string
	tokenArg            any
	ac                  *acquireConfig
	fw                  *fairWaiter
	sendAt              time.Time
	firstTry, queueNext bool          // single lock: see attempt
	first, mark         bool          // batch: see attemptBatch
	hold                time.Duration // a polling writer's of a read-write lock: see attemptRW
}

// batchInfo is what a batch lock holds besides a single lock's fields.
type batchInfo struct {
	resources []string
	keys      []string
	fences    []uint64
}

// heldError is the error of a batch attempt that found the keys at idx
// (1-based, as acquire_batch.lua answers) held by others.
func (b *batchInfo) heldError(idx []int) error {
	held := make([]string, 0, len(idx))
	for _, i := range idx {
		if i >= 1 && i <= len(b.resources) {
			held = append(held, b.resources[i-1])
		}
	}
	return &BatchHeldError{Held: held}
}
