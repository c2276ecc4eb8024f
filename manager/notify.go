package manager

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/sharding"
)

// notifier delivers the release scripts' announcements (SPUBLISH) to the
// waiters of this Manager: a hand-over, on this Manager's hand-over
// channel of the lock (sharding.HandoverChannel), to the local queues
// (localQueues.announced); a marked key freed with nobody handed it, on the
// lock's channel (sharding.ChannelName), to the batch waiters watching it
// (wakeFree) and the local queues (lookNow). A queued waiter watches both
// channels, a batch waiter the lock's channel. It keeps one sharded pub/sub
// connection per node it needs, shared by every waiter. A channel stays
// subscribed for subscribeLinger after its last waiter leaves (at most
// maxIdleSubs channels at a time), so that a process that waits for the
// same lock again and again subscribes once, not once per wait. Delivery
// is at most once, so waiters also re-check on a timer.
//
// A slot that leaves a node drops the subscribers of its channels there
// (the server says "sunsubscribe"): a channel that is still watched is
// subscribed again at once, on the slot's new node. On a cluster a
// subscription counts once the server confirms it: a node that does not
// serve the channel's slot (the client's slot map is behind a migration or
// a failover) answers MOVED, which go-redis's pub/sub connection drops
// unseen; such a subscription is left, the slot map reloaded, and the
// channel subscribed again (subscribeAttempts). A subscription can also
// be lost without a word (a node that failed over; a connection that
// go-redis made again to a node that lost the slot): a waiter whose
// re-check finds the lock handed to it with nothing heard subscribes its
// channel again (missed). While a channel is not subscribed its waiters
// re-check every fairRecheck, and they look at once when it is subscribed
// again.
type notifier struct {
	tr    *transport.Transport
	log   *zap.Logger
	owner string
	// The local queues' hooks: a waiter whose turn it is looks at once
	// (lookNow), a hand-over was announced (announced).
	lookNow   func(key string)
	announced func(key, payload string)

	// ctx bounds the subscription goroutines; close cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards the maps; no I/O is done while holding it.
	mu       sync.Mutex
	nodes    map[string]*nodeSub
	chans    map[string]*chanWaiters
	subs     map[string]*subscribing // the channels being subscribed: one attempt at a time each
	closed   bool
	idle     int  // subscribed channels nobody watches (idleAt set)
	sweeping bool // the sweep goroutine runs
	wg       sync.WaitGroup

	// healthCheck is how long a node's subscription connection goes
	// without a message before it pings the server (pubsubHealthCheck;
	// tests make it shorter).
	healthCheck time.Duration

	// handoverSuffix ends this Manager's hand-over channels
	// (sharding.HandoverChannel): a lock key's channel suffix, a colon
	// and the owner id.
	handoverSuffix string

	subscribes, unsubscribes atomic.Int64 // SSUBSCRIBE and SUNSUBSCRIBE sent, for tests

	// subscribed, when set (tests), is called by a subscription whose
	// attempt succeeded, before its node is recorded.
	subscribed func(ch string, ns *nodeSub)
}

// subscribeLinger is how long a channel stays subscribed after its last
// waiter leaves; maxIdleSubs bounds how many channels linger at a time.
const (
	subscribeLinger = 10 * time.Second
	maxIdleSubs     = 1024
)

type nodeSub struct {
	addr string
	ps   *redis.PubSub
}

type chanWaiters struct {
	node     *nodeSub  // nil while not subscribed
	failedAt time.Time // when its last subscription gave up (all its attempts failed)
	watchers int
	wakers   map[chan struct{}]struct{} // batch waiters, woken when the key is announced free
	idleAt   time.Time                  // when the last watcher left, while subscribed; zero while watched
}

// subscribing is a channel's subscription in the making. Guarded by
// notifier.mu.
type subscribing struct {
	sent chan struct{} // closed when its first SSUBSCRIBE is sent, or the first attempt failed
	on   *nodeSub      // the node subscription of its attempt, nil between attempts
	// confirm is closed when on's server confirms the SSUBSCRIBE awaiting
	// it; nil when none awaits.
	confirm chan struct{}
	// heard: on's server confirmed the SSUBSCRIBE; dropped: then it
	// dropped the channel (its slot left the node) before the attempt's
	// node was recorded.
	heard, dropped bool
}

// freePayload is what the release scripts publish when a key that waiters
// marked was deleted with nobody handed it (announce_free, handover.lua).
const freePayload = "free"

// subscribeWait bounds how long a waiter waits for its channel's
// subscription before it waits anyway (it re-checks on a timer).
const subscribeWait = time.Second

// A cluster's SSUBSCRIBE that the server has not confirmed within
// subscribeConfirm is taken to have failed; a channel is subscribed up to
// subscribeAttempts times in a row, subscribePause apart (doubled each
// time), while it is watched; after attempts that all failed (a server
// that refuses the channel: an ACL user without channel permissions, which
// Redis 7 makes by default, is answered NOPERM, dropped unseen as MOVED
// is), a waiter's refresh subscribes it again only subscribeCooldown
// later. resubscribePause is the pause before a channel the server dropped
// is subscribed again: the slot map reload it asks for is in by then.
const (
	subscribeConfirm  = 500 * time.Millisecond
	subscribeAttempts = 5
	subscribeCooldown = 5 * time.Second
	subscribePause    = 25 * time.Millisecond
	resubscribePause  = 10 * time.Millisecond
)

// newNotifier returns a notifier that subscribes through tr, for the
// hand-over channels of owner, and tells the local queues what it hears
// through lookNow and announced.
func newNotifier(tr *transport.Transport, log *zap.Logger, owner string, lookNow func(key string), announced func(key, payload string)) *notifier {
	ctx, cancel := context.WithCancel(context.Background())
	return &notifier{tr: tr, log: log, owner: owner, lookNow: lookNow, announced: announced, ctx: ctx, cancel: cancel, nodes: map[string]*nodeSub{}, chans: map[string]*chanWaiters{},
		subs: map[string]*subscribing{}, healthCheck: pubsubHealthCheck,
		handoverSuffix: sharding.HandoverChannel("", owner)}
}

// channels are the two channels a queued waiter of the lock at key watches:
// the lock's channel, where a release that deletes a marked key announces
// it free, and this Manager's hand-over channel of the lock, where a
// release that hands the lock to one of its waiters (or to one of the two
// waiters queued before its own) announces it.
func (n *notifier) channels(key string) [2]string {
	return [2]string{sharding.ChannelName(key), sharding.HandoverChannel(key, n.owner)}
}

// keyOf returns the lock key whose channel (or this Manager's hand-over
// channel) is ch.
func (n *notifier) keyOf(ch string) string {
	if k, ok := strings.CutSuffix(ch, n.handoverSuffix); ok {
		return k
	}
	return strings.TrimSuffix(ch, sharding.ChannelSuffix)
}

// watch keeps the channels of the lock at key subscribed (channels),
// subscribing them when no waiter of this Manager has yet; the returned
// function stops watching. It waits for a new subscription until it is
// made, ctx ends, until passes (zero: no limit) or subscribeWait passes,
// whichever comes first.
func (n *notifier) watch(ctx context.Context, key string, until time.Time) (unwatch func()) {
	chs := n.channels(key)
	return n.watchChans(ctx, key, until, chs[:])
}

// watchChans is watch of the channels chs of the lock at key.
func (n *notifier) watchChans(ctx context.Context, key string, until time.Time, chs []string) (unwatch func()) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return func() {}
	}
	var pending []chan struct{}
	for _, ch := range chs {
		cw := n.chans[ch]
		if cw == nil {
			cw = &chanWaiters{}
			n.chans[ch] = cw
		}
		if !cw.idleAt.IsZero() {
			cw.idleAt = time.Time{}
			n.idle--
		}
		cw.watchers++
		if p := n.subscribeLocked(key, ch, cw, again{}); p != nil {
			pending = append(pending, p)
		}
	}
	n.mu.Unlock()
	if len(pending) > 0 {
		wait := subscribeWait
		if left := time.Until(until); !until.IsZero() && left < wait {
			wait = max(left, 0)
		}
		t := time.NewTimer(wait)
	waiting:
		for _, p := range pending {
			select {
			case <-p:
			case <-ctx.Done():
				break waiting
			case <-t.C:
				break waiting
			}
		}
		t.Stop()
	}
	return func() {
		for _, ch := range chs {
			n.unwatch(ch)
		}
	}
}

// again says why a channel is subscribed again; zero for a first
// subscription.
type again struct {
	pause time.Duration // before the first attempt
	old   *nodeSub      // the subscription it had: left once it is made on another node
	moved bool          // old's server dropped it (its slot left): not sent there again, but for the last attempt
}

// subscribeLocked starts subscribing cw's channel ch, unless it is
// subscribed or being subscribed (or, but for a subscription made again,
// its last one failed less than subscribeCooldown ago), and returns the
// channel that closes when the first SSUBSCRIBE is sent (nil when none is
// to be made). n.mu must be held.
func (n *notifier) subscribeLocked(key, ch string, cw *chanWaiters, why again) chan struct{} {
	if cw.node != nil {
		return nil
	}
	if why.old == nil && !cw.failedAt.IsZero() && time.Since(cw.failedAt) < subscribeCooldown {
		return nil // failed lately: the waiters re-check meanwhile
	}
	sub := n.subs[ch]
	if sub == nil {
		sub = &subscribing{sent: make(chan struct{})}
		n.subs[ch] = sub
		n.wg.Go(func() { n.subscribe(key, ch, sub, why) })
	}
	return sub.sent
}

// subscribe subscribes ch on the connection of the node serving key, up
// to subscribeAttempts times while it is watched and not confirmed (see
// trySubscribe), then records the node on the channel's watchers (or, if
// nobody watches ch any more, unsubscribes).
func (n *notifier) subscribe(key, ch string, sub *subscribing, why again) {
	sent := sync.OnceFunc(func() { close(sub.sent) })
	defer sent()
	var ns *nodeSub
	pause, wait := why.pause, subscribePause
	for attempt := 1; attempt <= subscribeAttempts; attempt++ {
		if pause > 0 && !n.pause(pause) {
			break
		}
		var avoid *nodeSub
		if why.moved && attempt < subscribeAttempts {
			avoid = why.old
		}
		if ns = n.trySubscribe(key, ch, sub, sent, avoid); ns != nil || !n.watched(ch) {
			break
		}
		pause, wait = wait, 2*wait
	}
	if ns != nil && n.subscribed != nil {
		n.subscribed(ch, ns)
	}
	n.mu.Lock()
	delete(n.subs, ch)
	cw := n.chans[ch]
	watched := ns != nil && !n.closed && cw != nil
	if watched && cw.node == nil {
		cw.node, cw.failedAt = ns, time.Time{}
	}
	if ns == nil && cw != nil {
		cw.failedAt = time.Now()
	}
	// A slot that left ns's node between the confirmation and now took
	// the channel with it (deliver marked it, with the node not yet
	// recorded): handled now as deliver handles a recorded one.
	reload := watched && sub.dropped && n.droppedLocked(ch, ns)
	n.mu.Unlock()
	if reload {
		n.tr.Reload(n.ctx)
	}
	if ns != nil && !watched {
		n.unsubscribe(ns, ch) // nobody watches it any more
	}
	if watched && why.old != nil {
		// Subscribed again: what was announced meanwhile went unheard.
		n.wakeFree(ch)
		n.lookNow(key)
	}
	if old := why.old; ns != nil && old != nil && old != ns {
		// Or go-redis sends it to old's node again on a new connection.
		n.wg.Go(func() {
			n.unsubscribe(old, ch)
			n.closeIfUnused(old)
		})
	}
}

// hearing reports whether the channels of the lock at key are subscribed.
func (n *notifier) hearing(key string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ch := range n.channels(key) {
		if cw := n.chans[ch]; cw == nil || cw.node == nil {
			return false
		}
	}
	return true
}

// watched reports whether a waiter of this Manager watches ch.
func (n *notifier) watched(ch string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	cw := n.chans[ch]
	return !n.closed && cw != nil && cw.watchers > 0
}

// pause waits d, or less if the notifier closes; it reports whether d
// passed.
func (n *notifier) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-n.ctx.Done():
		return false
	}
}

// trySubscribe sends SSUBSCRIBE ch to the node serving key, calls sent,
// and on a cluster waits up to subscribeConfirm for the server to confirm
// it. It returns the node's subscription, or nil when the attempt failed:
// then an unconfirmed channel is left again (go-redis would send it again
// on a new connection) and the cluster's slot map is reloaded. When the
// slot map names node avoid, it reloads the map and sends nothing.
func (n *notifier) trySubscribe(key, ch string, sub *subscribing, sent func(), avoid *nodeSub) *nodeSub {
	ctx, cancel := context.WithTimeout(n.ctx, subscribeWait)
	defer cancel()
	defer sent()
	// failed ends an attempt that subscribed nothing.
	failed := func(err error) *nodeSub {
		if err != nil {
			n.log.Debug("subscribe failed; waiting by polling", zap.String("event", "subscribe_failed"), zap.Error(err))
		}
		n.mu.Lock()
		sub.on = nil
		n.mu.Unlock()
		return nil
	}
	node, err := n.tr.MasterFor(ctx, key)
	var ns *nodeSub
	if err == nil && node != nil {
		ns = n.nodeSub(node, sub)
	}
	if ns == nil || ns == avoid {
		if ns != nil {
			n.tr.Reload(ctx)
		}
		return failed(err)
	}
	var confirmed chan struct{}
	if n.tr.Cluster() != nil {
		confirmed = make(chan struct{})
		n.mu.Lock()
		sub.confirm = confirmed
		n.mu.Unlock()
	}
	n.subscribes.Add(1)
	err = ns.ps.SSubscribe(ctx, ch)
	sent()
	if err == nil && confirmed != nil {
		t := time.NewTimer(subscribeConfirm)
		select {
		case <-confirmed:
		case <-t.C:
			err = errUnconfirmed
		case <-ctx.Done():
			err = ctx.Err()
		}
		t.Stop()
		n.mu.Lock()
		sub.confirm = nil
		n.mu.Unlock()
		if err != nil {
			n.unsubscribe(ns, ch)
			n.tr.Reload(ctx)
		}
	}
	if err != nil {
		return failed(err)
	}
	return ns
}

// errUnconfirmed: the server did not confirm an SSUBSCRIBE in time.
var errUnconfirmed = errors.New("shardlock: the server did not confirm the subscription")

// nodeSub returns the subscription connection of node, making it (no I/O:
// the connection is made by its first command) if needed, and records it
// as the one sub's attempt uses; nil once closed.
func (n *notifier) nodeSub(node *redis.Client, sub *subscribing) *nodeSub {
	addr := node.Options().Addr
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	ns := n.nodes[addr]
	if ns == nil {
		ns = &nodeSub{addr: addr, ps: node.SSubscribe(n.ctx)}
		n.nodes[addr] = ns
		n.wg.Go(func() { n.receive(ns) })
	}
	sub.on, sub.heard, sub.dropped = ns, false, false
	return ns
}

// closeIfUnused closes the subscription connection ns, and forgets it,
// when no channel is subscribed on it and no subscription in the making
// uses it: a node that failed over or left the cluster is not dialled
// again and again.
func (n *notifier) closeIfUnused(ns *nodeSub) {
	n.mu.Lock()
	for _, cw := range n.chans {
		if cw.node == ns {
			n.mu.Unlock()
			return
		}
	}
	for _, sub := range n.subs {
		if sub.on == ns {
			n.mu.Unlock()
			return
		}
	}
	if n.nodes[ns.addr] == ns {
		delete(n.nodes, ns.addr)
	}
	n.mu.Unlock()
	_ = ns.ps.Close()
}

// watchFree is watch for a batch waiter: it also signals wake (without
// blocking; give it a buffer of one) each time the key is announced free.
func (n *notifier) watchFree(ctx context.Context, key string, until time.Time, wake chan struct{}) (unwatch func()) {
	ch := sharding.ChannelName(key)
	stop := n.watchChans(ctx, key, until, []string{ch})
	n.mu.Lock()
	if cw := n.chans[ch]; cw != nil {
		if cw.wakers == nil {
			cw.wakers = map[chan struct{}]struct{}{}
		}
		cw.wakers[wake] = struct{}{}
	}
	n.mu.Unlock()
	return func() {
		n.mu.Lock()
		if cw := n.chans[ch]; cw != nil {
			delete(cw.wakers, wake)
		}
		n.mu.Unlock()
		stop()
	}
}

// wakeFree signals the batch waiters of channel ch.
func (n *notifier) wakeFree(ch string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if cw := n.chans[ch]; cw != nil {
		for w := range cw.wakers {
			select {
			case w <- struct{}{}:
			default: // already signalled
			}
		}
	}
}

// unwatch stops one waiter's watch of ch; the last one's unsubscribes, in
// the background.
func (n *notifier) unwatch(ch string) {
	n.mu.Lock()
	cw := n.chans[ch]
	if cw == nil {
		n.mu.Unlock()
		return
	}
	cw.watchers--
	if cw.watchers > 0 {
		n.mu.Unlock()
		return
	}
	if cw.node != nil && !n.closed && n.idle < maxIdleSubs {
		// Linger: the next waiter need not subscribe again.
		cw.idleAt = time.Now()
		n.idle++
		if !n.sweeping {
			n.sweeping = true
			n.wg.Go(n.sweep)
		}
		n.mu.Unlock()
		return
	}
	delete(n.chans, ch)
	node, closed := cw.node, n.closed
	n.mu.Unlock()
	if node != nil && !closed {
		n.wg.Go(func() { n.unsubscribe(node, ch) })
	}
}

// unsubscribe leaves channel ch on node's connection.
func (n *notifier) unsubscribe(node *nodeSub, ch string) {
	ctx, cancel := context.WithTimeout(n.ctx, subscribeWait)
	defer cancel()
	n.unsubscribes.Add(1)
	_ = node.ps.SUnsubscribe(ctx, ch)
}

// sweep unsubscribes the channels that have lingered for subscribeLinger,
// until none lingers or the notifier closes.
func (n *notifier) sweep() {
	t := time.NewTimer(subscribeLinger)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		type sub struct {
			node *nodeSub
			ch   string
		}
		var expired []sub
		next := subscribeLinger
		now := time.Now()
		n.mu.Lock()
		for ch, cw := range n.chans {
			if cw.idleAt.IsZero() {
				continue
			}
			if left := subscribeLinger - now.Sub(cw.idleAt); left > 0 {
				next = min(next, left)
				continue
			}
			delete(n.chans, ch)
			n.idle--
			expired = append(expired, sub{cw.node, ch})
		}
		done := n.idle == 0 || n.closed
		if done {
			n.sweeping = false
		}
		n.mu.Unlock()
		for _, e := range expired {
			n.unsubscribe(e.node, e.ch)
		}
		if done {
			return
		}
		t.Reset(max(next, subscribeLinger/16))
	}
}

// receive reads ns's messages and delivers them until ns is closed. It
// reads the connection itself: go-redis's ChannelWithSubscriptions reads
// it in a goroutine of its own and passes each message on through a Go
// channel, one more goroutine hand-off between a release and the waiter it
// hands the lock to. Like that goroutine, receive pings the server after
// healthCheck without a message (a ping that fails makes go-redis
// dial again and subscribe the connection's channels again), and pauses
// before reading again after two failed reads in a row.
func (n *notifier) receive(ns *nodeSub) {
	failed := 0
	for {
		msg, err := ns.ps.ReceiveTimeout(n.ctx, n.healthCheck)
		if err == nil {
			failed = 0
			n.deliver(ns, msg)
			// A message most likely woke a waiter (its hand-over, a
			// re-check, a free key). Yield before reading again: the
			// waiter then runs on this P at once, instead of after the
			// next read has found nothing and parked, or on another
			// thread that must be woken first.
			runtime.Gosched()
			continue
		}
		if errors.Is(err, redis.ErrClosed) || n.ctx.Err() != nil {
			return
		}
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			ctx, cancel := context.WithTimeout(n.ctx, pubsubPingTimeout)
			_ = ns.ps.Ping(ctx)
			cancel()
			continue
		}
		if failed++; failed > 1 {
			t := time.NewTimer(pubsubErrorPause)
			select {
			case <-t.C:
			case <-n.ctx.Done():
				t.Stop()
				return
			}
		}
	}
}

// The health check of a node's subscription connection (go-redis's
// defaults for its pub/sub channels): a ping after pubsubHealthCheck
// without a message, bounded by pubsubPingTimeout; pubsubErrorPause
// between failed reads.
const (
	pubsubHealthCheck = 3 * time.Second
	pubsubPingTimeout = 5 * time.Second
	pubsubErrorPause  = 100 * time.Millisecond
)

// deliver hands one message of node ns to the local queues or the batch
// waiters, and subscribes a channel again that the server dropped.
func (n *notifier) deliver(ns *nodeSub, msg any) {
	var ch string
	switch v := msg.(type) {
	case *redis.Message:
		if v.Payload == freePayload {
			n.wakeFree(v.Channel)
			n.lookNow(n.keyOf(v.Channel))
		} else {
			n.announced(n.keyOf(v.Channel), v.Payload)
		}
		return
	case *redis.Subscription:
		switch v.Kind {
		case "ssubscribe":
			n.confirmed(ns, v.Channel)
			return
		case "sunsubscribe":
			// The server dropped the channel (its slot moved) or we left it.
			ch = v.Channel
		default:
			return
		}
	default:
		return
	}
	n.mu.Lock()
	if sub := n.subs[ch]; sub != nil && sub.on == ns && sub.heard {
		sub.dropped = true // confirmed on ns, its node not yet recorded (see subscribe)
	}
	resubscribe := n.droppedLocked(ch, ns)
	n.mu.Unlock()
	if resubscribe {
		n.tr.Reload(n.ctx)
	}
}

// droppedLocked forgets ch's subscription on ns, which ns's server dropped:
// a channel nobody watches is forgotten, a watched one is subscribed again
// on the slot's new node once the slot map has been reloaded. It reports
// whether the caller is to reload it (after unlocking n.mu).
func (n *notifier) droppedLocked(ch string, ns *nodeSub) (reload bool) {
	cw := n.chans[ch]
	if cw == nil || cw.node != ns {
		return false
	}
	cw.node = nil
	switch {
	case !cw.idleAt.IsZero():
		delete(n.chans, ch) // nobody watches it: nothing to subscribe again
		n.idle--
	case cw.watchers > 0 && !n.closed:
		n.subscribeLocked(n.keyOf(ch), ch, cw, again{pause: resubscribePause, old: ns, moved: true})
		return true
	}
	return false
}

// missed subscribes key's channels again: a waiter of this Manager found
// the lock handed to it by a re-check, with no announcement heard. The
// subscription may be gone without a word: its node failed over, or the
// connection was made again to a node that no longer serves the slot
// (go-redis subscribes its channels again and drops the MOVED replies).
func (n *notifier) missed(key string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	// Both channels: they share the node's connection, and so its fate.
	for _, ch := range n.channels(key) {
		if cw := n.chans[ch]; cw != nil && cw.node != nil && !n.closed {
			old := cw.node
			cw.node = nil
			n.subscribeLocked(key, ch, cw, again{old: old})
		}
	}
}

// confirmed marks the subscription of ch on ns that awaits the server's
// confirmation as confirmed.
func (n *notifier) confirmed(ns *nodeSub, ch string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if sub := n.subs[ch]; sub != nil && sub.confirm != nil && sub.on == ns {
		close(sub.confirm)
		sub.confirm, sub.heard = nil, true // sub.on stays: a drop from ns counts (see deliver)
	}
}

// close ends every subscription and waits for the notifier's goroutines.
func (n *notifier) close() {
	n.cancel()
	n.mu.Lock()
	n.closed = true
	nodes := n.nodes
	n.nodes = map[string]*nodeSub{}
	n.mu.Unlock()
	for _, ns := range nodes {
		_ = ns.ps.Close()
	}
	n.wg.Wait()
}

// refresh subscribes key's channels again, in the background, if the
// server dropped them.
func (n *notifier) refresh(key string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ch := range n.channels(key) {
		if cw := n.chans[ch]; cw != nil && !n.closed {
			n.subscribeLocked(key, ch, cw, again{})
		}
	}
}
