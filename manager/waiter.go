package manager

import (
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"
	"time"
)

// fairRecheck is the shortest re-check interval of a queued waiter.
const fairRecheck = 100 * time.Millisecond

// fairWaiter is the waiter whose turn it is in a local queue, as far as the
// fair queue in Redis is concerned. Guarded by localQueues.mu.
type fairWaiter struct {
	token    string
	digest   string // sha1 hex of token, as release.lua announces it
	ttl      time.Duration
	fencing  bool
	mark     string    // its entry's kind field (lockKind.queueMark)
	deadline time.Time // the waiter gives up by then; its entry is dead after
	entry    string    // its entry in Redis's queue once queued (or being queued), else ""
	regAt    time.Time // send time of the first write that queued entry
	left     bool      // gave up or acquired otherwise
	// expires: when the key may be free with nobody handing it over: the
	// end of a lease handed to another process's waiter, or of the TTL a
	// re-check read; zero when unknown.
	expires time.Time
	took    bool // acquired: by a hand-over, or by finding its own token (a re-check)
	heard   bool // a hand-over to it was announced
	// handing: a release of this process's holder is queueing w or handing
	// it the lock (nextForRelease); w makes no attempt of its own until
	// afterRelease settles it, or w's entry would be queued twice.
	handing bool
	// transferred: a lock handed to w by transfer and not yet taken up; a
	// waiter that gives up instead has it released (giveUp).
	transferred *transfer
	ch          chan grantMsg
	// rearm wakes the waiter's sleep to take a new expires into account
	// (a hand-over announced to another waiter: look when its lease ends)
	// when that comes before wakeAt, the time its sleep was set for.
	rearm  chan struct{}
	wakeAt time.Time
}

// grantMsg tells a fair waiter that it holds the lock (retry false), or that
// it must attempt on its own (retry true: nobody queued it after all).
type grantMsg struct {
	fence     uint64
	validFrom time.Time
	retry     bool
	claimed   bool      // handed over from Redis's queue, on the claim lease
	transfer  *transfer // handed over in this process, without a round trip
}

// transfer is a lock handed to this process's next waiter without a round
// trip (localQueues.transfer): the key keeps the releasing lock's token and
// TTL, which the new holder takes over.
type transfer struct {
	key        string
	token      string
	tokenArg   any
	validUntil mono
}

// expiryLag is how long after a key's expected expiry a waiter looks: the
// key is gone from the server by then.
const expiryLag = 2 * time.Millisecond

func (w *fairWaiter) recheckAtLocked() time.Time {
	if w.expires.IsZero() {
		return time.Time{}
	}
	at := w.expires.Add(expiryLag)
	if !time.Now().Before(at) {
		w.expires = time.Time{}
	}
	return at
}

// newFairWaiter returns the fair waiter of token; mark is its entry's kind
// field (lockKind.queueMark).
func newFairWaiter(token string, ac *acquireConfig, deadline time.Time, mark string) *fairWaiter {
	sum := sha1.Sum([]byte(token))
	return &fairWaiter{token: token, digest: hex.EncodeToString(sum[:]), ttl: ac.ttl,
		fencing: ac.fencing, mark: mark, deadline: deadline, ch: make(chan grantMsg, 1), rearm: make(chan struct{}, 1)}
}

// makeEntry formats w's queue entry (see handover.lua; a reader's, of a
// read-write lock, says "r" in place of the fencing flag: see rw.lua).
func (w *fairWaiter) makeEntry() string {
	return strconv.FormatInt(w.deadline.UnixMilli(), 10) + ":" + strconv.FormatInt(w.ttl.Milliseconds(), 10) + ":" + w.mark + ":" + w.token
}

// cutEntry splits a queue entry (makeEntry's format, which handover.lua
// and rw.lua read too) into its four fields, without allocating: ok false
// for anything with fewer.
func cutEntry(e string) (deadline, ttl, flag, token string, ok bool) {
	deadline, rest, ok1 := strings.Cut(e, ":")
	ttl, rest, ok2 := strings.Cut(rest, ":")
	flag, token, ok3 := strings.Cut(rest, ":")
	return deadline, ttl, flag, token, ok1 && ok2 && ok3
}

// grant delivers g without blocking (the channel holds one message; a newer
// grant replaces nothing: the first one stands).
func (w *fairWaiter) grant(g grantMsg) {
	select {
	case w.ch <- g:
	default:
	}
}

// queueLocked gives w its entry, to be written by a command sent at sentAt:
// the earliest time a hand-over to w can have happened (kept from the first
// such write). localQueues.mu must be held.
func (w *fairWaiter) queueLocked(sentAt time.Time) string {
	w.entry = w.makeEntry()
	if w.regAt.IsZero() {
		w.regAt = sentAt
	}
	return w.entry
}
