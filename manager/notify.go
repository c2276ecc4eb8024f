package manager

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/shardlock/shardlock/sharding"
)

// notifier delivers hand-over announcements (SPUBLISH on a lock's channel,
// sent by the release scripts) to the waiters of this Manager: to the local
// queues (localQueues.announced), or, when a marked key was freed, to the
// batch waiters watching it (wakeFree). It keeps one sharded pub/sub
// connection per node it needs, shared by every waiter. Delivery is at
// most once and a slot that moves drops its subscribers, so waiters also
// re-check on a timer.
type notifier struct {
	m *Manager

	mu     sync.Mutex
	nodes  map[string]*nodeSub
	chans  map[string]*chanWaiters
	closed bool
	wg     sync.WaitGroup
}

type nodeSub struct {
	addr string
	ps   *redis.PubSub
}

type chanWaiters struct {
	node     *nodeSub // nil while not subscribed
	watchers int
	wakers   map[chan struct{}]struct{} // batch waiters, woken when the key is announced free
}

// freePayload is what the release scripts publish when a key that waiters
// marked was deleted with nobody handed it (announce_free, handover.lua).
const freePayload = "free"

func newNotifier(m *Manager) *notifier {
	return &notifier{m: m, nodes: map[string]*nodeSub{}, chans: map[string]*chanWaiters{}}
}

// nodeClient returns the client of the master that serves key.
func (n *notifier) nodeClient(ctx context.Context, key string) (*redis.Client, error) {
	switch c := n.m.client.(type) {
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, key)
	case *redis.Client:
		return c, nil
	}
	return nil, nil
}

// watch keeps the channel of the lock at key subscribed, subscribing it
// when no waiter of this Manager has yet; the returned function stops
// watching.
func (n *notifier) watch(ctx context.Context, key string) (unwatch func()) {
	ch := sharding.ChannelName(key)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return func() {}
	}
	cw := n.chans[ch]
	if cw == nil {
		cw = &chanWaiters{}
		n.chans[ch] = cw
	}
	cw.watchers++
	if cw.node == nil {
		cw.node = n.subscribeLocked(ctx, key, ch)
	}
	return func() { n.unwatch(ch) }
}

// subscribeLocked subscribes ch on the connection of the node serving key.
func (n *notifier) subscribeLocked(ctx context.Context, key, ch string) *nodeSub {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	node, err := n.nodeClient(ctx, key)
	if err != nil || node == nil {
		return nil
	}
	addr := node.Options().Addr
	ns := n.nodes[addr]
	if ns == nil {
		ns = &nodeSub{addr: addr, ps: node.SSubscribe(ctx)}
		n.nodes[addr] = ns
		msgs := ns.ps.ChannelWithSubscriptions(redis.WithChannelSize(1024))
		n.wg.Go(func() { n.deliver(ns, msgs) })
	}
	if err := ns.ps.SSubscribe(ctx, ch); err != nil {
		n.m.log.Debug("subscribe failed; waiting by polling", zap.String("event", "subscribe_failed"), zap.Error(err))
		return nil
	}
	return ns
}

// watchFree is watch for a batch waiter: it also signals wake (without
// blocking; give it a buffer of one) each time the key is announced free.
func (n *notifier) watchFree(ctx context.Context, key string, wake chan struct{}) (unwatch func()) {
	stop := n.watch(ctx, key)
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

func (n *notifier) unwatch(ch string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	cw := n.chans[ch]
	if cw == nil {
		return
	}
	cw.watchers--
	if cw.watchers > 0 {
		return
	}
	delete(n.chans, ch)
	if cw.node != nil && !n.closed {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = cw.node.ps.SUnsubscribe(ctx, ch)
		cancel()
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
		}
		n.mu.Unlock()
	}
}

// close ends every subscription and waits for the delivery goroutines.
func (n *notifier) close() {
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

// refresh subscribes key's channel again if the server dropped it.
func (n *notifier) refresh(ctx context.Context, key string) {
	ch := sharding.ChannelName(key)
	n.mu.Lock()
	defer n.mu.Unlock()
	if cw := n.chans[ch]; cw != nil && cw.node == nil && !n.closed {
		cw.node = n.subscribeLocked(ctx, key, ch)
	}
}
