package manager

import (
	"strconv"
	"strings"
	"time"

	"github.com/shardlock/shardlock/internal/scripts"
)

// The fair queue.
//
// A waiting Acquire of one resource queues up twice. In this process, the
// waiters of a resource form a local queue (localQueue) and only its head,
// the waiter whose turn it is, deals with Redis. In Redis, that head puts an
// entry on the lock's waiter list (sharding.QueueKey) and waits for its
// turn there: release.lua hands the key straight to the first live entry
// (SET to the entry's token, with the entry's TTL) and announces it on the
// hand-over channel of that entry's process (sharding.HandoverChannel), so
// the waiter holds the lock the moment it hears, without another round trip
// and without a herd of retries. Announcements are at
// most once, so a waiter also re-checks (acquire_queue.lua) at a bounded
// interval; a re-check finds a missed hand-over as its own token in the key.
//
// A waiter may have died while queued. So the key handed to it lives for
// the claim lease (scripts.ClaimLease) only, until the new holder confirms
// it with its first renewal, which the watchdog sends (even with the
// watchdog off) when three quarters of the lease are left (a lock released
// before then needs none), or a re-check; both set the full TTL. A lock taken on its lease is valid, by this process's clock, from the
// waiter's first queue write, the earliest the hand-over can have happened:
// a waiter queued for so long that less than half the lease would be left
// confirms it with a re-check before it returns the lock. The release also
// announces the hand-over to the processes of the two entries queued next;
// a waiter that hears a hand-over not its own looks again when the lease
// would end (recheckAt; its sleep is woken to take that time), so a dead
// waiter's hand-over, or two in a row, costs the next live waiter about one
// lease; and a re-check learns the key's TTL, so waiters also look when a
// holder that died lets it expire.
//
// A process that holds the lock and has local waiters queues its next
// waiter with the release, and may hand the lock to it directly, up to
// maxLocalHandoffs times in a row, before the next process in Redis's queue
// gets it.

// maxLocalHandoffs bounds how many times in a row a process passes a lock to
// its own next waiter while other processes may be queued for it.
const maxLocalHandoffs = 3

// recheckAt returns when w is to look at the key again because it may have
// expired with nobody handing it over (zero: no such time), taking that time
// off w once it has come, so that it makes one look for it.
func (lq *localQueues) recheckAt(w *fairWaiter) time.Time {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	return w.recheckAtLocked()
}

// sleepUntil returns when w, whose own next look is at lookAt, is to wake:
// then, or at recheckAt if that is earlier. It records that time, so that a
// hand-over to another waiter announced while w sleeps wakes it (rearm) only
// when the end of that lease comes first.
func (lq *localQueues) sleepUntil(w *fairWaiter, lookAt time.Time) time.Time {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	wake := lookAt
	if at := w.recheckAtLocked(); !at.IsZero() && at.Before(wake) {
		wake = at
	}
	w.wakeAt = wake
	return wake
}

// Contention hints last hintFor and are kept for at most maxHints keys.
const (
	hintFor  = time.Second
	maxHints = 4096
)

// sawContended notes that key has waiters queued in Redis.
func (lq *localQueues) sawContended(key string) {
	lq.hmu.Lock()
	defer lq.hmu.Unlock()
	if lq.hints == nil || len(lq.hints) >= maxHints {
		lq.hints = map[string]time.Time{} // forget them all rather than grow
	}
	lq.hints[key] = time.Now()
	lq.nhints.Store(int64(len(lq.hints)))
}

// queueLives reports whether this process extended key's queue to live
// until deadline at least (queueExtended), as far as it knows.
func (lq *localQueues) queueLives(key string, deadline time.Time) bool {
	lq.hmu.Lock()
	defer lq.hmu.Unlock()
	until, ok := lq.qlives[key]
	if ok && time.Now().After(until) {
		delete(lq.qlives, key)
	}
	return ok && !deadline.After(until)
}

// queueExtended records that key's queue lives until until.
func (lq *localQueues) queueExtended(key string, until time.Time) {
	lq.hmu.Lock()
	defer lq.hmu.Unlock()
	if lq.qlives == nil || len(lq.qlives) >= maxHints {
		lq.qlives = map[string]time.Time{} // forget them all rather than grow
	}
	lq.qlives[key] = until
}

// contended reports whether key was seen contended within hintFor.
func (lq *localQueues) contended(key string) bool {
	if lq.nhints.Load() == 0 {
		return false // the common case: no clock read, no lock
	}
	lq.hmu.Lock()
	defer lq.hmu.Unlock()
	at, ok := lq.hints[key]
	if ok && time.Since(at) > hintFor {
		delete(lq.hints, key)
		lq.nhints.Store(int64(len(lq.hints)))
		ok = false
	}
	return ok
}

// join enters the queue of key, or returns ErrTooManyWaiters.
func (lq *localQueues) join(key string) (*localQueue, error) {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	q := lq.queues[key]
	if q == nil {
		q = &localQueue{turn: make(chan struct{}, 1)}
		q.turn <- struct{}{}
		lq.queues[key] = q
		lq.active.Add(1)
	}
	if lq.max > 0 && q.members >= lq.max {
		return nil, ErrTooManyWaiters
	}
	q.members++
	return q, nil
}

// busy reports whether local waiters are queued for key.
func (lq *localQueues) busy(key string) bool {
	if lq.active.Load() == 0 {
		return false // nobody waits anywhere: the common case
	}
	lq.mu.Lock()
	defer lq.mu.Unlock()
	return lq.queues[key] != nil
}

// leave quits the queue of key.
func (lq *localQueues) leave(key string, q *localQueue) {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	q.members--
	if q.members == 0 {
		delete(lq.queues, key)
		lq.active.Add(-1)
	}
}

// setHead makes w the head of q and reports whether a lock taken through q
// is held now (then its release queues w, and w need not attempt).
func (lq *localQueues) setHead(q *localQueue, w *fairWaiter) (holderPresent bool) {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	q.head = w
	return q.holder != nil
}

// markQueued records that w's entry is being queued by a write sent at
// sentAt. It reports recheck when w is queued already, and skip when a
// local release is handing w the lock (w then makes no attempt).
func (lq *localQueues) markQueued(w *fairWaiter, sentAt time.Time) (entry string, recheck, skip bool) {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	if w.handing {
		return "", false, true
	}
	if w.entry != "" {
		return w.entry, true, false
	}
	return w.queueLocked(sentAt), false, false
}

// acquired records that w's waiter took l: l is q's holder now.
func (lq *localQueues) acquired(q *localQueue, w *fairWaiter, l *Lock) {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	if w != nil {
		w.left, w.took, w.transferred = true, true, nil
		if q.head == w {
			q.head = nil
		}
	}
	q.holder = l
}

// giveUp takes w out of q; it returns w's entry when w was (or was being)
// queued in Redis, so the caller can take it out there.
func (lq *localQueues) giveUp(q *localQueue, w *fairWaiter) (entry string, transferred *transfer) {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	w.left = true
	if q.head == w {
		q.head = nil
	}
	transferred, w.transferred = w.transferred, nil
	return w.entry, transferred
}

// handover is what a release does for this process's next waiter.
type handover struct {
	w      *fairWaiter // nil: nothing
	q      *localQueue
	local  bool // hand the lock to w before anyone queued in Redis
	entry  string
	sentAt time.Time // when the release carrying entry is sent
}

// nextForRelease picks the local waiter that the release of l should queue
// or hand the lock to: the head of key's local queue when nobody has queued
// it yet. The clock is read only when there is one.
func (lq *localQueues) nextForRelease(l *Lock) handover {
	if lq.active.Load() == 0 {
		return handover{}
	}
	lq.mu.Lock()
	defer lq.mu.Unlock()
	q := lq.queues[l.key]
	if q == nil {
		return handover{}
	}
	if q.holder == l {
		q.holder = nil
	}
	w := q.head
	if w == nil || w.entry != "" || w.left {
		return handover{}
	}
	sentAt := time.Now()
	w.handing = true
	return handover{w: w, q: q, local: q.streak < maxLocalHandoffs, entry: w.queueLocked(sentAt), sentAt: sentAt}
}

// maxTransferAge bounds how old a token is handed over in the process
// (transfer): the exporter and the operators' tool read a holder's age from
// its token, which a chain of such hand-overs keeps.
const maxTransferAge = 10 * time.Second

// transfer hands the lock l is releasing to h's waiter without a round
// trip, when the release would hand it to that waiter directly (h.local)
// and nothing is to change in Redis: both unfenced (a new holder needs a
// new fence), the same TTL, and l valid for at least half its TTL more
// (or, on a claim lease, half the lease). The key keeps l's token, which
// the waiter takes over with l's validity and claim lease; exclusion is as
// if l held on. The token must be younger than maxTransferAge. It returns
// false, changing nothing, when the lock is not to be transferred.
func (lq *localQueues) transfer(l *Lock, h handover) bool {
	w := h.w
	if w == nil || !h.local || l.fence != 0 || w.fencing || w.ttl != l.ttl || !l.kind.handsOver() {
		return false
	}
	l.mu.Lock()
	claimed, until := l.w.rn.claimed, l.validUntil
	l.mu.Unlock()
	if left := until.Sub(monoNow()); left < l.ttl/2 && (!claimed || left < scripts.ClaimLease/2) {
		return false
	}
	if ms, ok := tokenMillis(l.token); !ok || time.Since(time.UnixMilli(ms)) > maxTransferAge {
		return false
	}
	lq.mu.Lock()
	defer lq.mu.Unlock()
	if w.left || w.took || w.entry != h.entry {
		return false
	}
	// w stays handing until it takes the lock up (or gives up): an
	// attempt of its own would queue it in Redis.
	w.entry = ""
	h.q.streak++
	t := &transfer{key: l.key, token: l.token, tokenArg: l.args[0], validUntil: until}
	w.transferred = t
	// The grant must reach the waiter: a retry or an announcement waiting
	// in its channel is superseded by it.
	select {
	case <-w.ch:
	default:
	}
	w.ch <- grantMsg{validFrom: time.Now(), transfer: t, claimed: claimed}
	return true
}

// holderGone forgets l as the holder of its key's local queue (it was
// released or lost); a head that waited for l's release to queue it
// attempts on its own.
func (lq *localQueues) holderGone(l *Lock) {
	if lq.active.Load() == 0 {
		return
	}
	lq.mu.Lock()
	defer lq.mu.Unlock()
	q := lq.queues[l.key]
	if q == nil || q.holder != l {
		return
	}
	q.holder = nil
	if w := q.head; w != nil && w.entry == "" && !w.left {
		w.grant(grantMsg{retry: true})
	}
}

// announced handles a hand-over announced on key's channel: payload is
// "<sha1 of the new holder's token> <fence>".
func (lq *localQueues) announced(key, payload string) {
	digest, fenceStr, ok := strings.Cut(payload, " ")
	if !ok || lq.active.Load() == 0 {
		return
	}
	lq.mu.Lock()
	defer lq.mu.Unlock()
	q := lq.queues[key]
	if q == nil || q.head == nil || q.head.left || q.head.entry == "" {
		return
	}
	if q.head.digest != digest {
		// Handed to another waiter, on its lease: if that waiter is dead,
		// the key is free again when the lease ends. Look then, whenever
		// the waiter's own re-check is due.
		w := q.head
		w.expires = time.Now().Add(scripts.ClaimLease)
		if w.expires.Add(expiryLag).Before(w.wakeAt) {
			select {
			case w.rearm <- struct{}{}:
			default: // already woken
			}
		}
		return
	}
	fence, _ := strconv.ParseUint(fenceStr, 10, 64)
	q.head.heard = true
	q.head.grant(grantMsg{fence: fence, validFrom: q.head.regAt, claimed: true})
}

// lookNow wakes the waiter whose turn it is for key to look at once,
// rather than at its next re-check: when the key was deleted with nobody
// handed it (release.lua's "free"), it takes the key; when its channel was
// subscribed again, it finds a hand-over announced while nobody listened.
func (lq *localQueues) lookNow(key string) {
	if lq.active.Load() == 0 {
		return
	}
	lq.mu.Lock()
	defer lq.mu.Unlock()
	if q := lq.queues[key]; q != nil && q.head != nil && !q.head.left && !q.head.handing {
		q.head.grant(grantMsg{retry: true})
	}
}
