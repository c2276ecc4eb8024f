package manager

import "time"

// watchEntry.idx outside the heap.
const (
	idxNone       = -1 // not watched
	idxProcessing = -2 // taken out by collect, being renewed or checked
	idxIncoming   = -3 // in s.incoming, not yet in the heap
)

// renewState is the watchdog's bookkeeping of a lock's renewals, under the
// lock's mutex: what the holder sees (validity, errors, Done) stays in Lock.
type renewState struct {
	interval time.Duration
	lastSent mono // send time of the last successful write of the key's TTL
	next     mono // when the next renewal is due
	// claimed: the lock was handed over from Redis's queue on the claim
	// lease (see queue.go) and no renewal has set its TTL since; its first
	// renewal is sent even without the watchdog.
	claimed bool
	// fixedInterval: the renew interval was set explicitly, not TTL/3.
	fixedInterval bool
	// watched: the lock has left the scheduler's incoming list for its heap,
	// so giving it up must take it out of the heap (see scheduler.add).
	watched bool
	// renewing: the watchdog's renewal is in flight; the lock stays in the
	// heap, due at the end of its validity, so that a renewal stuck in I/O
	// never delays the loss.
	renewing bool
	fails    int // renewals failed in a row, for the backoff and the log
	// watchdog: the watchdog renews the lock (WithWatchdog); without it,
	// only a claim lease's confirmation is sent.
	watchdog  bool
	maxHoldAt mono // when the watchdog stops renewing (WithMaxHold); zero: never
	maxFired  bool // the max hold has passed: no more renewals
}

// watchEntry is the scheduler's bookkeeping of a lock it watches: when it
// must next look at it, and where the lock is in its heap. Only the
// scheduler reads or writes it, under its mutex.
type watchEntry struct {
	due   mono
	slack time.Duration // how early a renewal may go, to share a pipeline
	idx   int           // in the heap, or idxNone, idxProcessing, idxIncoming
}

// watch is the watchdog's entry for one lock: its renewals (under the
// lock's mutex) and its place in the scheduler (under the scheduler's). The
// Lock, which holds what its holder sees, points to it; newLock allocates
// the two together, so a lock still costs one allocation. The scheduler
// renews a lock with the Lock's kind, keys and token.
type watch struct {
	rn renewState
	wd watchEntry
}
