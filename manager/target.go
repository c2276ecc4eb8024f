package manager

import (
	"time"

	"github.com/shardlock/shardlock/internal/scripts"
)

// target is what an acquire locks: one resource, or a batch in one slot.
type target struct {
	resource, key string     // the first (or only) resource and its key
	batch         *batchInfo // nil for a single lock
	rw            rwMode     // a read-write lock's reader or writer, else rwNone
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
