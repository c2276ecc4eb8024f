package manager

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/shardlock/shardlock/sharding"
)

// notifier delivers hand-over announcements (SPUBLISH on a lock's channel,
// sent by the release scripts) to the waiters of this Manager: to the local
// queues (localQueues.announced), or, when a marked key was freed, to the
// batch waiters watching it (wakeFree). It keeps one sharded pub/sub
// connection per node it needs, shared by every waiter. A channel stays
// subscribed for subscribeLinger after its last waiter leaves (at most
// maxIdleSubs channels at a time), so that a process that waits for the
// same lock again and again subscribes once, not once per wait. Delivery
// is at most once and a slot that moves drops its subscribers, so waiters
// also re-check on a timer.
type notifier struct {
	m *Manager

	// ctx bounds the subscription goroutines; close cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards the maps; no I/O is done while holding it.
	mu       sync.Mutex
	nodes    map[string]*nodeSub
	chans    map[string]*chanWaiters
	closed   bool
	idle     int  // subscribed channels nobody watches (idleAt set)
	sweeping bool // the sweep goroutine runs
	wg       sync.WaitGroup

	subscribes, unsubscribes atomic.Int64 // SSUBSCRIBE and SUNSUBSCRIBE sent, for tests
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
	node     *nodeSub      // nil while not subscribed
	pending  chan struct{} // closed when the subscription attempt in flight ends; nil if none
	watchers int
	wakers   map[chan struct{}]struct{} // batch waiters, woken when the key is announced free
	idleAt   time.Time                  // when the last watcher left, while subscribed; zero while watched
}

// freePayload is what the release scripts publish when a key that waiters
// marked was deleted with nobody handed it (announce_free, handover.lua).
const freePayload = "free"

// subscribeWait bounds how long a waiter waits for its channel's
// subscription before it waits anyway (it re-checks on a timer).
const subscribeWait = time.Second

func newNotifier(m *Manager) *notifier {
	ctx, cancel := context.WithCancel(context.Background())
	return &notifier{m: m, ctx: ctx, cancel: cancel, nodes: map[string]*nodeSub{}, chans: map[string]*chanWaiters{}}
}

// watch keeps the channel of the lock at key subscribed, subscribing it
// when no waiter of this Manager has yet; the returned function stops
// watching. It waits for a new subscription until it is made, ctx ends,
// until passes (zero: no limit) or subscribeWait passes, whichever comes
// first.
func (n *notifier) watch(ctx context.Context, key string, until time.Time) (unwatch func()) {
	ch := sharding.ChannelName(key)
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return func() {}
	}
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
	pending := n.subscribeLocked(key, ch, cw)
	n.mu.Unlock()
	if pending != nil {
		wait := subscribeWait
		if left := time.Until(until); !until.IsZero() && left < wait {
			wait = max(left, 0)
		}
		t := time.NewTimer(wait)
		select {
		case <-pending:
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	return func() { n.unwatch(ch) }
}

// subscribeLocked starts subscribing cw's channel ch, unless it is
// subscribed or being subscribed, and returns the channel that closes when
// the attempt ends (nil when subscribed). n.mu must be held.
func (n *notifier) subscribeLocked(key, ch string, cw *chanWaiters) chan struct{} {
	if cw.node != nil {
		return nil
	}
	if cw.pending == nil {
		p := make(chan struct{})
		cw.pending = p
		n.wg.Go(func() { n.subscribe(key, ch, cw, p) })
	}
	return cw.pending
}

// subscribe subscribes ch on the connection of the node serving key, then
// records it on cw (or, if nobody watches ch any more, unsubscribes), and
// closes p.
func (n *notifier) subscribe(key, ch string, cw *chanWaiters, p chan struct{}) {
	defer close(p)
	ctx, cancel := context.WithTimeout(n.ctx, subscribeWait)
	defer cancel()
	var ns *nodeSub
	node, err := n.m.topo.masterFor(ctx, key)
	if err == nil && node != nil {
		if ns = n.nodeSub(node); ns != nil {
			n.subscribes.Add(1)
			err = ns.ps.SSubscribe(ctx, ch)
		}
	}
	n.mu.Lock()
	cw.pending = nil
	watched := false
	if err == nil && ns != nil && !n.closed {
		if cur := n.chans[ch]; cur != nil {
			watched = true
			if cur.node == nil {
				cur.node = ns
			}
		}
	}
	n.mu.Unlock()
	switch {
	case err != nil:
		n.m.log.Debug("subscribe failed; waiting by polling", zap.String("event", "subscribe_failed"), zap.Error(err))
	case ns != nil && !watched:
		n.unsubscribes.Add(1)
		_ = ns.ps.SUnsubscribe(ctx, ch) // nobody watches it any more
	}
}

// nodeSub returns the subscription connection of node, making it (no I/O:
// the connection is made by its first command) if needed; nil once closed.
func (n *notifier) nodeSub(node *redis.Client) *nodeSub {
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
		msgs := ns.ps.ChannelWithSubscriptions(redis.WithChannelSize(1024))
		n.wg.Go(func() { n.deliver(ns, msgs) })
	}
	return ns
}

// watchFree is watch for a batch waiter: it also signals wake (without
// blocking; give it a buffer of one) each time the key is announced free.
func (n *notifier) watchFree(ctx context.Context, key string, until time.Time, wake chan struct{}) (unwatch func()) {
	stop := n.watch(ctx, key, until)
	ch := sharding.ChannelName(key)
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

// deliver hands one node's messages to the local queues until the
// subscription is closed.
func (n *notifier) deliver(ns *nodeSub, msgs <-chan any) {
	for msg := range msgs {
		var ch string
		dropped := false
		switch v := msg.(type) {
		case *redis.Message:
			if v.Payload == freePayload {
				n.wakeFree(v.Channel)
				n.m.queues.freed(channelKey(v.Channel))
			} else {
				n.m.queues.announced(channelKey(v.Channel), v.Payload)
			}
			continue
		case *redis.Subscription:
			if v.Kind != "sunsubscribe" {
				continue
			}
			// The server dropped the channel (its slot moved) or we left it.
			ch, dropped = v.Channel, true
		default:
			continue
		}
		n.mu.Lock()
		if cw := n.chans[ch]; cw != nil && dropped && cw.node == ns {
			cw.node = nil // the next refresh subscribes again, on the slot's new node
			if !cw.idleAt.IsZero() {
				delete(n.chans, ch) // nobody watches it: nothing to subscribe again
				n.idle--
			}
		}
		n.mu.Unlock()
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

// refresh subscribes key's channel again, in the background, if the
// server dropped it.
func (n *notifier) refresh(key string) {
	ch := sharding.ChannelName(key)
	n.mu.Lock()
	defer n.mu.Unlock()
	if cw := n.chans[ch]; cw != nil && !n.closed {
		n.subscribeLocked(key, ch, cw)
	}
}
