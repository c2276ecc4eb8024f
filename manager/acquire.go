package manager

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/metrics"
)

// TryAcquire makes one attempt to take the lock on resource.
//
// It returns ErrNotAcquired when another owner holds it, an
// *InvalidArgumentError for bad input (before any round trip), ErrClosed
// after Close, a *ReplicaAckError under WithReplicaAck(…, ReplicaFail), or
// the Redis error.
func (m *Manager) TryAcquire(ctx context.Context, resource string, opts ...AcquireOption) (*Lock, error) {
	return m.acquire(ctx, resource, opts, kindExclusive, false)
}

// Acquire takes the lock on resource, waiting while another owner holds it,
// with the retry strategy, until the wait limit (default 30 s) or until ctx
// ends. Transient Redis errors (a failover, a migrating slot) are retried the
// same way.
//
// When the wait ends without the lock it returns an error that matches
// ErrNotAcquired, and also ctx's error when ctx ended it, or the error of
// the last attempt when Redis failed. Otherwise it returns what TryAcquire
// returns.
//
// Every acquire returns by ctx's deadline (and Acquire by its wait limit)
// whatever the client's timeouts and options; an attempt whose reply comes
// later is released as soon as it comes. With ctx already ended it sends
// nothing.
func (m *Manager) Acquire(ctx context.Context, resource string, opts ...AcquireOption) (*Lock, error) {
	return m.acquire(ctx, resource, opts, kindExclusive, true)
}

// acquire takes a lock of kind on resource: an exclusive lock, or a
// read-write lock's reader or writer.
func (m *Manager) acquire(ctx context.Context, resource string, opts []AcquireOption, kind lockKind, wait bool) (*Lock, error) {
	if err := m.usable(); err != nil {
		return nil, err
	}
	ac, key, err := m.acquireConfig(resource, opts)
	if err != nil {
		m.mx.Class(metrics.ClassDefault).AcquireFailed(0, metrics.ReasonInvalid)
		return nil, err
	}
	if !kind.fenced() {
		ac.fencing = false
	}
	if kind == kindExclusive && !ac.fencing && m.conditional.Load() {
		kind = kindExclusiveNative
	}
	return m.acquireMeasured(ctx, target{kind: kind, resource: resource, key: key}, &ac, wait)
}

// acquireMeasured resolves the metrics class of tg, runs the acquire loop
// and records its outcome.
func (m *Manager) acquireMeasured(ctx context.Context, tg target, ac *acquireConfig, wait bool) (*Lock, error) {
	m.resolveClass(ac, tg.resource)
	start := time.Now()
	l, err := m.acquireLoop(ctx, tg, ac, wait, start)
	if ac.cls != nil {
		if err == nil {
			ac.cls.Acquired(time.Since(start))
		} else {
			ac.cls.AcquireFailed(time.Since(start), acquireReason(err, wait))
		}
	}
	return l, err
}

// acquireReason is the metrics reason of an acquire's error.
func acquireReason(err error, wait bool) string {
	switch {
	case errors.Is(err, ErrInvalidArgument):
		return metrics.ReasonInvalid
	case errors.Is(err, ErrClosed):
		return metrics.ReasonClosed
	case errors.Is(err, ErrReplicaAck):
		return metrics.ReasonReplicaAck
	case errors.Is(err, ErrTooManyWaiters):
		return metrics.ReasonTooManyWaiters
	case errors.Is(err, context.Canceled):
		return metrics.ReasonCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return metrics.ReasonTimeout
	case errors.Is(err, ErrNotAcquired) && wait:
		return metrics.ReasonTimeout
	case errors.Is(err, ErrNotAcquired):
		return metrics.ReasonContended
	}
	return metrics.ReasonRedisError
}

// transientRetry bounds the wait after an attempt that failed for a
// transient reason (a failover, a migrating slot).
const transientRetry = 100 * time.Millisecond

// How an acquire works.
//
// An acquirer makes attempts (attemptN) until one takes the key, the
// caller's context or the wait limit ends it, or the retry strategy says
// stop. Between attempts it waits in one of three ways:
//
//   - the fair queue (queue.go, attempt_queued.go), for a single lock with notifications on:
//     it queues behind this process's other waiters for the resource
//     (queueUp), then in Redis, and is handed the lock by the release
//     before it; it also re-checks on a timer (waitTurn);
//   - the batch watch, for a batch with notifications on: it marks the
//     keys others hold and wakes when one is announced free (watchBatch);
//   - polling, on the retry strategy's timer, otherwise.
//
// An attempt whose outcome was never learned may hold the key: whatever
// ends the acquire without a lock hands its token to the reaper (fail).
type acquirer struct {
	m     *Manager
	ctx   context.Context
	tg    target
	ac    *acquireConfig
	wait  bool // Acquire, not TryAcquire
	start time.Time

	token    string
	tokenArg any // token boxed once, for the acquire command and the Lock's scripts

	waitUntil       time.Time // the wait limit
	attemptDeadline time.Time // when an attempt's reply can no longer be used
	firstAmbiguous  time.Time // send time of the first attempt whose outcome we never learned
	lastErr         error     // why the last attempt failed, while it was transient
	sent            int       // attempts sent to Redis: what the retry strategy counts (see woken)
	answered        bool      // an attempt was answered: Redis is there
	transient       bool      // the last attempt failed for a transient reason
	waiting         bool      // counted in the waiters gauge
	timer           *time.Timer

	// The fair queue (see queue.go): one resource, notifications on, no
	// replica acknowledgement.
	fair       bool
	queueFirst bool        // the first attempt queues at once (see run)
	queue      *localQueue // this process's queue for the resource, once waiting
	myTurn     bool        // this waiter is the one contending in Redis
	unwatch    func()      // stops watching the lock's channels, once queued
	fw         *fairWaiter // this waiter in the fair queue, once its turn came
	granted    *grantMsg   // a hand-over received, to be taken up
	skipOnce   bool        // a local holder's release will queue us: no attempt now

	// The batch watch: a waiting batch marks the keys others hold and
	// wakes when one is announced free (same conditions as the fair queue).
	batchWatch bool
	wake       chan struct{} // signalled when a watched key is freed
	// woken: the next attempt is one a watched key's release woke. The
	// default strategy does not count it: every release wakes every
	// waiter of the key, and all but one of them lose the race, so
	// counted wake-ups would end a contended batch's wait long before
	// DefaultWait. A strategy given with WithRetry counts every attempt.
	woken     bool
	watched   []string // the batch keys whose channels this waiter watches
	unwatches []func()
}

func (m *Manager) acquireLoop(ctx context.Context, tg target, ac *acquireConfig, wait bool, start time.Time) (*Lock, error) {
	if ctx == nil {
		return nil, invalid("context", "nil")
	}
	if m.closed.Load() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(ErrNotAcquired, err) // nothing sent
	}
	a := acquirer{m: m, ctx: ctx, tg: tg, ac: ac, wait: wait, start: start, waitUntil: start.Add(ac.wait)}
	a.token = newToken(m.cfg.owner, start)
	a.tokenArg = a.token
	// An attempt ends by the wait limit; a TryAcquire's by the TTL (a
	// reply after that could not be used).
	a.attemptDeadline = a.waitUntil
	if !wait {
		a.attemptDeadline = start.Add(ac.ttl)
	}
	notify := wait && m.notify != nil && m.cfg.replicas == 0
	a.fair = notify && tg.kind.queues()
	a.batchWatch = notify && !tg.kind.queues()
	// A waiting acquire does not barge in ahead of this process's queued
	// waiters for the resource: it queues behind them. So does one of a
	// key this process saw contended lately: the queue script takes the
	// key if it is free, so a SET NX first would only cost a command.
	a.queueFirst = wait && tg.kind.queues() && (m.queues.busy(tg.key) || (a.fair && m.queues.contended(tg.key)))
	defer a.finish()
	defer func() {
		// A callback that panics (a retry strategy) must not strand an
		// attempt that may hold the key.
		if p := recover(); p != nil {
			a.orphanAmbiguous()
			panic(p)
		}
	}()
	return a.run()
}

// run makes attempts and waits between them until the acquire ends.
func (a *acquirer) run() (*Lock, error) {
	for n := 1; ; n++ {
		res, sendAt, err := a.attemptN(n)
		if err != nil {
			if l, done, err := a.failed(err, sendAt); done {
				return l, err
			}
		} else {
			if res.status != attemptContended {
				l, again, err := a.take(res, sendAt)
				if !again {
					return l, err
				}
				// The reply came too late: wait as for a held lock.
			}
			a.lastErr, a.answered = nil, true // Redis answered
		}
		if l, done, err := a.between(res); done {
			return l, err
		}
	}
}

// attemptN makes attempt n, or takes up what came instead of one: a
// hand-over, or a release that is about to queue this waiter.
func (a *acquirer) attemptN(n int) (res attemptResult, sendAt time.Time, err error) {
	sendAt = a.start // one clock read fewer on the first attempt, the hot path
	if n > 1 {
		sendAt = time.Now()
	}
	if g := a.granted; g != nil && g.claimed && g.transfer == nil && time.Until(g.validFrom.Add(claimValidity)) < scripts.ClaimLease/2 {
		// Handed over on the claim lease, but queued so long ago that
		// too little of the lease may be left: a re-check confirms it
		// (or finds it lost) instead. (A lock handed over in the process
		// is taken up whatever is left: take settles one whose validity
		// ran out, and nothing else would settle it.)
		a.granted = nil
	}
	switch {
	case n == 1 && a.queueFirst:
		res.status = attemptContended
	case a.granted != nil:
		// Handed over by a release: held since (at the earliest) the
		// write that queued us.
		g := a.granted
		a.granted = nil
		res.status, res.fence, res.claimed = attemptFresh, g.fence, g.claimed
		if t := g.transfer; t != nil {
			a.token, a.tokenArg, a.firstAmbiguous = t.token, t.tokenArg, time.Time{}
			res.validUntil = t.validUntil
		}
		return res, g.validFrom, nil
	case a.skipOnce:
		res.status, a.skipOnce = attemptContended, false
	default:
		if !a.woken || a.ac.retrySet {
			a.sent++
		}
		a.woken = false
		res, err = a.m.sendAttempt(a.ctx, a.attemptDeadline, attemptArgs{
			tg: a.tg, token: a.token, tokenArg: a.tokenArg, ac: a.ac, fw: a.fw, sendAt: sendAt,
			// The first attempt is a plain SET NX; a waiter that will
			// queue next need not tell a replay apart (the queue script
			// does), and later polls use SET NX GET.
			firstTry: n == 1 || (n == 2 && a.queueFirst), queueNext: a.fair,
			first: n == 1, mark: a.batchWatch, hold: a.writerHold(),
		})
	}
	return res, sendAt, err
}

// writerHold is how long new readers are to wait for a read-write lock's
// writer that waits by polling (not queued: no notifications, or
// WithReplicaAck) if this attempt finds the lock held: until about its next
// poll, so that readers do not take the lock from under it while it
// sleeps. Zero for anything else.
func (a *acquirer) writerHold() time.Duration {
	if !a.tg.kind.holdsReaders() || !a.wait || a.fair {
		return 0
	}
	return min(max(2*a.ac.retry.NextBackoff(a.sent+1), 100*time.Millisecond), 2*time.Second)
}

// failed handles an attempt that failed with err: it ends the acquire
// (done) or records a transient failure to wait out.
func (a *acquirer) failed(err error, sendAt time.Time) (l *Lock, done bool, _ error) {
	// A command that may have run, or a script that failed after a write
	// (an error reply that is not a redirect or a "not now"), may hold the
	// key: fail releases it. An abandoned attempt is settled by sendAttempt when
	// its reply comes.
	abandoned := transport.IsAbandoned(err)
	if !abandoned && (transport.IsAmbiguous(err) || transport.RanWithError(err)) && a.firstAmbiguous.IsZero() {
		a.firstAmbiguous = sendAt
	}
	if a.ctx.Err() != nil {
		return nil, true, a.fail(errors.Join(ErrNotAcquired, a.ctx.Err()))
	}
	if a.m.closed.Load() {
		// Close ran meanwhile (a waiter can get its turn in the local
		// queue as Close wakes it, and its attempt then meets the closed
		// transport): the acquire ends as every other one Close ends.
		return nil, true, a.fail(ErrClosed)
	}
	if a.wait && (abandoned || !time.Now().Before(a.waitUntil)) {
		// The wait limit passed during the attempt: say why the last
		// attempts failed, or that this one had no reply in time; an
		// attempt that was not even sent is just the wait limit.
		if a.answered && a.lastErr == nil {
			// Redis answers, the lock is held: the wait limit merely cut
			// the last look short.
			return nil, true, a.fail(ErrNotAcquired)
		}
		if cause := cmp.Or(a.lastErr, transport.AbandonedCause(err)); cause != nil {
			return nil, true, a.fail(errors.Join(ErrNotAcquired, cause))
		}
		return nil, true, a.fail(ErrNotAcquired)
	}
	if !a.wait || !transport.IsTransient(err) {
		return nil, true, a.fail(fmt.Errorf("shardlock: acquire %q: %w", a.tg.resource, err))
	}
	a.m.tr.Reload(a.ctx)
	a.transient, a.lastErr = true, err
	return nil, false, nil
}

// take makes the Lock of an attempt that took the key (sent at sendAt). It
// asks for another attempt (again) when the reply came too late to use.
func (a *acquirer) take(res attemptResult, sendAt time.Time) (_ *Lock, again bool, _ error) {
	m, tg := a.m, a.tg
	validFrom := sendAt
	if res.status == attemptReplay && a.fw == nil && !a.firstAmbiguous.IsZero() {
		// The key may have been set that early. (A fair waiter's re-check
		// that finds its token sets the key's TTL anew.)
		validFrom = a.firstAmbiguous
	}
	l := m.newLock(tg.kind, tg.resource, tg.key, a.token, a.tokenArg, res.fence, a.start, validFrom, a.ac)
	l.viaQueue = res.claimed || a.fw != nil
	// Handed over from Redis's queue, not in this process (transfer).
	l.handed = res.claimed && res.validUntil.IsZero()
	if res.claimed {
		l.onClaim(validFrom)
	}
	if !res.validUntil.IsZero() {
		l.takeOver(res.validUntil)
	}
	l.replicas = res.replicas
	if tg.batch != nil {
		l.batch = tg.batch // the acquire's own: the Lock takes it over
		l.batch.fences = res.fences
		if len(res.fences) > 0 {
			l.fence = res.fences[0]
		}
	}
	if m.cfg.replicas > 0 && res.replicas < m.cfg.replicas && m.cfg.replicaPolicy == ReplicaFail {
		m.orphan(tg, a.token, l.validUntil.Time())
		return nil, false, &ReplicaAckError{Want: m.cfg.replicas, Got: res.replicas}
	}
	if !monoNow().Before(l.validUntil) {
		// The reply came after the lock would have expired. The token
		// goes to the orphan reaper, so later attempts need a token of
		// their own.
		m.orphan(tg, a.token, l.validUntil.Time())
		if !a.wait {
			return nil, false, ErrNotAcquired
		}
		a.token, a.firstAmbiguous = newToken(m.cfg.owner, time.Now()), time.Time{}
		a.tokenArg = a.token
		if a.fw != nil {
			// Queue again, with the new token.
			a.leaveRedisQueue()
			a.fw = newFairWaiter(a.token, a.ac, a.waitUntil, a.tg.kind.queueMark(a.ac.fencing))
			m.queues.setHead(a.queue, a.fw)
		}
		return nil, true, nil
	}
	if a.queue != nil {
		holder := l
		if !tg.kind.handsOver() {
			// A read-write lock's release hands nothing to this process's
			// next waiter directly: readers share it (see kind_rw.go).
			holder = nil
		}
		m.queues.acquired(a.queue, a.fw, holder)
		a.fw = nil
	}
	if !m.sched.add(l) {
		l.releaseNow()
		return nil, false, ErrClosed
	}
	if ce := m.log.Check(zap.DebugLevel, "lock acquired"); ce != nil {
		ce.Write(m.fields(a.ctx, "acquired", l, zap.Duration("waited", time.Since(a.start)), zap.Int("attempts", a.sent))...)
	}
	return l, false, nil
}

// between decides, after an attempt that did not take the key (res), how
// to go on: it ends the acquire (done) or waits for the next attempt.
func (a *acquirer) between(res attemptResult) (_ *Lock, done bool, _ error) {
	notAcquired := ErrNotAcquired
	if len(res.held) > 0 {
		notAcquired = a.tg.batch.heldError(res.held)
	}
	if !a.wait {
		return nil, true, a.fail(notAcquired)
	}
	if !a.waiting && a.ac.cls != nil {
		a.waiting = true
		a.ac.cls.Waiting(1)
	}
	if a.tg.kind.queues() && a.queue == nil {
		// The next attempt comes at this waiter's turn in the queue,
		// without a wait of the strategy's: the strategy still says
		// whether there is one.
		if a.ac.retry.NextBackoff(a.sent) <= 0 {
			return nil, true, a.stop(notAcquired)
		}
		if err := a.queueUp(notAcquired); err != nil {
			return nil, true, err
		}
		return nil, false, nil
	}
	if a.batchWatch {
		if added := a.watchBatch(res.held); added {
			// A key watched for the first time gets one more look at
			// once, as it may have been freed before the subscription;
			// the look is an attempt too.
			if a.ac.retry.NextBackoff(a.sent) <= 0 {
				return nil, true, a.stop(notAcquired)
			}
			return nil, false, nil
		}
		for _, k := range a.watched {
			a.m.notify.refresh(k)
		}
	} else if a.m.notify != nil {
		a.m.notify.refresh(a.tg.key)
	}
	// The retry strategy counts the attempts sent; a hand-over takes the
	// lock without one.
	d, ok := nextWait(a.ac.retry, a.sent, a.waitUntil)
	if !ok {
		return nil, true, a.stop(notAcquired)
	}
	if a.fw != nil && !a.ac.retrySet {
		// Queued, the default strategy re-checks at most every
		// fairRecheck: the release before hands the lock over. While the
		// lock's channels are not subscribed (its slot moved, its node
		// failed over), hand-overs go unheard: it re-checks every
		// fairRecheck.
		recheck := min(fairRecheck, time.Until(a.waitUntil))
		if a.m.notify.hearing(a.tg.key) {
			d = max(d, recheck)
		} else {
			d = recheck
		}
	}
	if a.transient {
		// Redis failed rather than the lock being held: look again soon,
		// so locking resumes as soon as a failover completes.
		d, a.transient = min(d, transientRetry), false
	}
	if err := a.sleep(d, notAcquired); err != nil {
		return nil, true, err
	}
	return nil, false, nil
}

// queueUp joins this process's queue for the resource and waits for this
// waiter's turn to contend in Redis.
func (a *acquirer) queueUp(notAcquired error) error {
	m := a.m
	q, err := m.queues.join(a.tg.key)
	if err != nil {
		return a.fail(err)
	}
	a.queue = q
	// Every queued waiter watches the lock's channels, so they stay
	// subscribed while this process has waiters: subscribed once, not
	// once per turn.
	if m.notify != nil {
		a.unwatch = m.notify.watch(a.ctx, a.tg.key, a.waitUntil)
	}
	if remaining := time.Until(a.waitUntil); remaining > 0 {
		resetTimer(&a.timer, remaining)
		select {
		case <-q.turn:
			a.myTurn = true
		case <-a.ctx.Done():
			return a.fail(errors.Join(notAcquired, a.ctx.Err()))
		case <-m.closing:
			return a.fail(ErrClosed)
		case <-a.timer.C:
		}
	}
	if !a.myTurn {
		return a.fail(notAcquired)
	}
	if a.fair {
		a.fw = newFairWaiter(a.token, a.ac, a.waitUntil, a.tg.kind.queueMark(a.ac.fencing))
		// With a lock taken through this queue held, its release queues
		// us (or hands us the lock): no attempt now.
		a.skipOnce = m.queues.setHead(q, a.fw)
	}
	return nil
}

// watchBatch watches the channels of the batch keys found held (now
// marked) that it does not watch yet, and reports whether there were any.
func (a *acquirer) watchBatch(held []int) (added bool) {
	keys := a.tg.batch.keys
	for _, i := range held {
		if i < 1 || i > len(keys) || slices.Contains(a.watched, keys[i-1]) {
			continue
		}
		if a.wake == nil {
			a.wake = make(chan struct{}, 1)
		}
		k := keys[i-1]
		a.watched = append(a.watched, k)
		a.unwatches = append(a.unwatches, a.m.notify.watchFree(a.ctx, k, a.waitUntil, a.wake))
		added = true
	}
	return added
}

// sleep waits d for the next attempt, or less: a hand-over, a watched
// batch key freed, or (a fair waiter) the moment the key may have expired
// with nobody handing it over (recheckAt), unless a newer hand-over moved
// that time on meanwhile. It returns the acquire's error when ctx ends or
// the Manager closes.
func (a *acquirer) sleep(d time.Duration, notAcquired error) error {
	m := a.m
	var (
		grants chan grantMsg
		rearm  chan struct{}
	)
	if a.fw != nil {
		grants, rearm = a.fw.ch, a.fw.rearm
	}
	lookAt := time.Now().Add(d)
	for {
		wakeAt := lookAt
		if a.fw != nil {
			wakeAt = m.queues.sleepUntil(a.fw, lookAt)
		}
		resetTimer(&a.timer, time.Until(wakeAt))
		select {
		case <-a.ctx.Done():
			return a.fail(errors.Join(notAcquired, a.ctx.Err()))
		case <-m.closing:
			return a.fail(ErrClosed)
		case <-a.timer.C:
			if wakeAt.Before(lookAt) {
				if at := m.queues.recheckAt(a.fw); at.After(time.Now()) {
					continue // moved on by a newer hand-over
				}
			}
		case <-rearm:
			continue // a new time to look (recheckAt)
		case g := <-grants:
			if !g.retry {
				a.granted = &g
			}
		case <-a.wake: // a watched batch key was freed
			a.woken = true
		}
		if m.closed.Load() {
			return a.fail(ErrClosed)
		}
		return nil
	}
}

// stop ends a wait the strategy ends, saying why the last attempt failed
// where it failed for a transient reason.
func (a *acquirer) stop(notAcquired error) error {
	if a.lastErr != nil {
		return a.fail(errors.Join(notAcquired, a.lastErr))
	}
	return a.fail(notAcquired)
}

// fail ends the acquire with err. An attempt may still run on the server:
// its token is released in the background so it cannot strand the key
// until its TTL.
func (a *acquirer) fail(err error) error {
	a.orphanAmbiguous()
	return err
}

// orphanAmbiguous hands the token to the reaper if an attempt whose
// outcome was never learned may hold the key.
func (a *acquirer) orphanAmbiguous() {
	if !a.firstAmbiguous.IsZero() {
		a.m.orphan(a.tg, a.token, a.firstAmbiguous.Add(a.ac.ttl))
	}
}

// leaveRedisQueue takes this waiter out of the fair queue, and out of
// Redis's queue if it was queued there.
func (a *acquirer) leaveRedisQueue() {
	entry, transferred := a.m.queues.giveUp(a.queue, a.fw)
	if entry != "" {
		a.m.leaveQueued(a.ctx, a.tg.kind, a.tg.key, a.fw, entry)
	}
	if transferred != nil {
		// Handed over in this process as this waiter gave up: nobody
		// holds the key.
		a.m.reap(transferred.key, transferred.token, a.tg.kind.perKey(), transferred.validUntil.Time())
	}
}

// finish undoes what waiting set up: the channel watches, the timer, this
// waiter's place in the queues (handing the turn on), the waiters gauge.
func (a *acquirer) finish() {
	if a.unwatch != nil {
		a.unwatch()
	}
	if a.timer != nil {
		a.timer.Stop()
	}
	if a.queue != nil {
		if a.fw != nil {
			a.leaveRedisQueue()
		}
		if a.myTurn {
			a.queue.turn <- struct{}{} // the next local waiter contends
		}
		a.m.queues.leave(a.tg.key, a.queue)
	}
	for _, unwatch := range a.unwatches {
		unwatch()
	}
	if a.waiting {
		a.ac.cls.Waiting(-1)
	}
}

// nextWait returns how long to wait before retry n (1-based), bounded by
// waitUntil, or false when the strategy or the wait limit says stop.
func nextWait(retry RetryStrategy, n int, waitUntil time.Time) (time.Duration, bool) {
	d := retry.NextBackoff(n)
	remaining := time.Until(waitUntil)
	if d <= 0 || remaining <= 0 {
		return 0, false
	}
	return min(d, remaining), true
}

// resetTimer arms *t for d, making it on first use.
func resetTimer(t **time.Timer, d time.Duration) {
	if *t == nil {
		*t = time.NewTimer(d)
		return
	}
	(*t).Reset(d)
}

// leaveQueued takes a waiter that gave up out of Redis's queue; if its entry
// is not there (it may have been handed the lock already, or be about to
// be), its token goes to the orphan reaper. It waits for that while ctx
// lasts, for at most leaveWait (a round trip, unless Redis is in trouble),
// and leaves the rest to the background: the caller is on its way out and
// must not wait past its deadline.
func (m *Manager) leaveQueued(ctx context.Context, kind lockKind, key string, w *fairWaiter, entry string) {
	leave := func(context.Context) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if left, err := kind.leave(m, ctx, key, entry); err == nil && left {
			return nil
		}
		until := time.Now()
		if w.deadline.After(until) {
			until = w.deadline
		}
		m.reap(key, w.token, kind.perKey(), until.Add(w.ttl))
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
