package manager

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/sharding"
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

// fairRecheck is the shortest re-check interval of a queued waiter.
const fairRecheck = 100 * time.Millisecond

// fairWaiter is the waiter whose turn it is in a local queue, as far as the
// fair queue in Redis is concerned. Guarded by localQueues.mu.
type fairWaiter struct {
	token    string
	digest   string // sha1 hex of token, as release.lua announces it
	ttl      time.Duration
	fencing  bool
	mode     rwMode    // a read-write lock's reader or writer, else rwNone
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

// recheckAt returns when w is to look at the key again because it may have
// expired with nobody handing it over (zero: no such time), taking that time
// off w once it has come, so that it makes one look for it.
func (lq *localQueues) recheckAt(w *fairWaiter) time.Time {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	return w.recheckAtLocked()
}

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

func newFairWaiter(token string, ac *acquireConfig, deadline time.Time, mode rwMode) *fairWaiter {
	sum := sha1.Sum([]byte(token))
	return &fairWaiter{token: token, digest: hex.EncodeToString(sum[:]), ttl: ac.ttl,
		fencing: ac.fencing, mode: mode, deadline: deadline, ch: make(chan grantMsg, 1), rearm: make(chan struct{}, 1)}
}

// makeEntry formats w's queue entry (see handover.lua; a reader's, of a
// read-write lock, says "r" in place of the fencing flag: see rw.lua).
func (w *fairWaiter) makeEntry() string {
	kind := luaFlag(w.fencing)
	if w.mode == rwRead {
		kind = "r"
	}
	return strconv.FormatInt(w.deadline.UnixMilli(), 10) + ":" + strconv.FormatInt(w.ttl.Milliseconds(), 10) + ":" + kind + ":" + w.token
}

// send delivers g without blocking (the channel holds one message; a newer
// grant replaces nothing: the first one stands).
func (w *fairWaiter) send(g grantMsg) {
	select {
	case w.ch <- g:
	default:
	}
}

// localQueues makes the waiters of one resource in this process queue up,
// so that only one of them at a time contends in Redis.
type localQueues struct {
	mu     sync.Mutex
	queues map[string]*localQueue
	max    int          // waiters per resource at most; 0: no limit
	active atomic.Int64 // len(queues), read without the lock by busy

	// Keys this process saw contended lately (its release handed one to a
	// queued waiter): a waiting Acquire of one goes straight to the queue
	// script, which takes a free key too, instead of trying SET NX first.
	hmu    sync.Mutex
	hints  map[string]time.Time // when it was seen contended
	nhints atomic.Int64         // len(hints), read without the lock
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

type localQueue struct {
	turn    chan struct{} // holds the token while no waiter contends
	members int

	// The fair queue, under localQueues.mu.
	head   *fairWaiter // the waiter whose turn it is, in fair mode
	holder *Lock       // a lock on the key that a waiter of this queue took, while held
	streak int         // hand-overs in a row to this process's own waiters
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
	if w == nil || !h.local || l.fence != 0 || w.fencing || w.ttl != l.ttl || l.multi != nil || l.rw != rwNone || w.mode != rwNone {
		return false
	}
	l.mu.Lock()
	claimed, until := l.rn.claimed, l.validUntil
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

// afterRelease settles a handover with the release script's outcome: code
// as release.lua returns it, or ambiguous when the reply was lost.
func (m *Manager) afterRelease(l *Lock, h handover, code int64, fence uint64, sentAt time.Time, ambiguous bool) {
	if h.w == nil {
		return
	}
	lq := &m.queues
	lq.mu.Lock()
	defer lq.mu.Unlock()
	w := h.w
	w.handing = false
	switch {
	case code == scripts.HandedToNext: // w holds the lock now
		if h.local {
			h.q.streak++
		} else {
			h.q.streak = 0
		}
		if w.took {
			// The waiter's re-check found the lock handed to it first
			// (its own token in the key): it holds the lock already.
			return
		}
		if w.left {
			// The waiter gave up meanwhile: the lock is nobody's.
			m.reap(l.key, w.token, sentAt.Add(w.ttl))
			return
		}
		w.send(grantMsg{fence: fence, validFrom: sentAt})
	case code == scripts.HandedOver: // w is queued behind the waiter that got the lock
		h.q.streak = 0
	case ambiguous:
		// w may or may not be queued (or hold the lock): its re-check
		// finds out.
	default: // the script did not run its hand-over: w must attempt
		if w.entry == h.entry {
			w.entry = ""
		}
		w.send(grantMsg{retry: true})
	}
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
		w.send(grantMsg{retry: true})
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
	q.head.send(grantMsg{fence: fence, validFrom: q.head.regAt, claimed: true})
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
		q.head.send(grantMsg{retry: true})
	}
}

// attemptQueued runs acquire_queue.lua for w: take the key if free, else
// queue w's entry (or, on a re-check, make sure it is queued).
func (m *Manager) attemptQueued(ctx context.Context, key string, w *fairWaiter, ac *acquireConfig) (status int, fence uint64, err error) {
	entry, recheck, skip := m.queues.markQueued(w, time.Now())
	if skip {
		return attemptContended, 0, nil // a local release is handing w the lock: wait for it
	}
	keys := []string{key, sharding.QueueKey(key)}
	if ac.fencing {
		keys = append(keys, sharding.FenceKey(key))
	}
	res, err := scripts.AcquireQueue.Run(transport.WithTryAgainFallback(ctx), m.cmd, keys,
		w.token, ac.ttlMs, luaArg(ac.fencing), entry, luaArg(recheck)).Slice()
	status, fence, err = parseFenced(res, err)
	m.afterQueuedAttempt(key, w, entry, recheck, status, fence, err)
	if transport.IsTryAgain(err) {
		return m.attemptUnqueued(ctx, key, w, ac, recheck, entry)
	}
	if status == attemptContended {
		fence = 0
	}
	return status, fence, err
}

// attemptUnqueued is a fair waiter's attempt while the lock's slot migrates
// and the queue script's keys are not all on one node (Redis answers
// TRYAGAIN to a script whose keys are partly missing from a migrating slot,
// and the queue key is missing until someone queues). It runs
// acquire_batch.lua on the lock key alone (with the fence counter, when
// fencing): the key is taken if free, or else the holder's token gets the
// queued mark, so that its release announces the key free and wakes this
// waiter (localQueues.freed). A waiter that takes the key this way takes its
// entry out of the queue, if it was queued.
func (m *Manager) attemptUnqueued(ctx context.Context, key string, w *fairWaiter, ac *acquireConfig, recheck bool, entry string) (status int, fence uint64, err error) {
	status, fences, _, _, err := m.attemptBatch(ctx, &batchInfo{keys: []string{key}}, w.token, ac, true, true)
	if err != nil || status == attemptContended {
		return status, 0, err
	}
	if recheck {
		_ = m.client.LRem(ctx, sharding.QueueKey(key), 1, entry).Err() // or it expires at its deadline
	}
	if len(fences) > 0 {
		fence = fences[0]
	}
	return status, fence, nil
}

// afterQueuedAttempt records what a queue script's attempt for w at key
// (with entry, a re-check or not) learned: on a re-check that found the
// key held, its TTL (pttl, in ms), when w is to look again; on a failure
// that queued nothing, that w's entry is not queued. A re-check that found
// the lock handed to w with no announcement heard has the key's channel
// subscribed again (notifier.missed): the subscription may be gone unseen.
func (m *Manager) afterQueuedAttempt(key string, w *fairWaiter, entry string, recheck bool, status int, pttl uint64, err error) {
	lq := &m.queues
	if err == nil && recheck && status == attemptReplay && m.notify != nil {
		lq.mu.Lock()
		heard := w.heard
		lq.mu.Unlock()
		if !heard {
			m.notify.missed(key)
		}
	}
	if err == nil && status == attemptContended && recheck && pttl > 0 {
		lq.mu.Lock()
		w.expires = time.Now().Add(time.Duration(pttl) * time.Millisecond)
		lq.mu.Unlock()
	}
	if err != nil && !transport.IsAmbiguous(err) && !recheck {
		// Not queued: the next attempt queues it.
		lq.mu.Lock()
		if w.entry == entry {
			w.entry = ""
		}
		lq.mu.Unlock()
	}
}

// leaveQueued takes a waiter that gave up out of Redis's queue; if its entry
// is not there (it may have been handed the lock already, or be about to
// be), its token goes to the orphan reaper. It waits for that while ctx
// lasts, for at most leaveWait (a round trip, unless Redis is in trouble),
// and leaves the rest to the background: the caller is on its way out and
// must not wait past its deadline.
func (m *Manager) leaveQueued(ctx context.Context, key string, w *fairWaiter, entry string) {
	leave := func(context.Context) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var (
			n   int64
			err error
		)
		if w.mode == rwNone {
			n, err = m.client.LRem(ctx, sharding.QueueKey(key), 1, entry).Result()
		} else {
			n, err = m.tr.RunScript(ctx, m.client, scripts.RWLeave, []string{key}, entry).Int64()
		}
		if err == nil && n == 1 {
			return nil
		}
		until := time.Now()
		if w.deadline.After(until) {
			until = w.deadline
		}
		m.reapMode(key, w.token, w.mode, until.Add(w.ttl))
		return nil
	}
	if ctx.Err() != nil {
		m.tr.Go(func() { _ = leave(nil) })
		return
	}
	_ = m.tr.Bounded(ctx, time.Now().Add(leaveWait), leave, nil)
}

// leaveWait bounds how long a waiter that gave up waits for its queue
// entry's removal.
const leaveWait = 50 * time.Millisecond
