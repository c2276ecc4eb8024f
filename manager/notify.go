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

// notifier delivers release announcements (SPUBLISH on a lock's channel,
// sent by the release script) to the waiters of this Manager. It keeps one
// sharded pub/sub connection per node it needs, shared by every waiter, and
// fans messages out locally. Delivery is at most once and a slot that moves
// drops its subscribers, so waiters also re-check on a timer.
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
	node    *nodeSub // nil while not subscribed
	waiters map[chan struct{}]struct{}
}

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

// watch registers wake for the releases of the lock at key, subscribing
// its channel when no waiter of this Manager has yet. It reports whether it
// subscribed just now (a release before that went unannounced); the
// returned function unregisters.
func (n *notifier) watch(ctx context.Context, key string, wake chan struct{}) (fresh bool, unwatch func()) {
	ch := sharding.ChannelName(key)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false, func() {}
	}
	cw := n.chans[ch]
	if cw == nil {
		cw = &chanWaiters{waiters: map[chan struct{}]struct{}{}}
		n.chans[ch] = cw
	}
	cw.waiters[wake] = struct{}{}
	if cw.node == nil {
		cw.node = n.subscribeLocked(ctx, key, ch)
		fresh = cw.node != nil
	}
	return fresh, func() { n.unwatch(ch, wake) }
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

func (n *notifier) unwatch(ch string, wake chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	cw := n.chans[ch]
	if cw == nil {
		return
	}
	delete(cw.waiters, wake)
	if len(cw.waiters) > 0 {
		return
	}
	delete(n.chans, ch)
	if cw.node != nil && !n.closed {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = cw.node.ps.SUnsubscribe(ctx, ch)
		cancel()
	}
}

// deliver fans one node's messages out to the channels' waiters until the
// subscription is closed.
func (n *notifier) deliver(ns *nodeSub, msgs <-chan any) {
	for msg := range msgs {
		var ch string
		dropped := false
		switch v := msg.(type) {
		case *redis.Message:
			ch = v.Channel
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
		if cw := n.chans[ch]; cw != nil {
			if dropped && cw.node == ns {
				cw.node = nil // the next watch subscribes again, on the slot's new node
			}
			for w := range cw.waiters {
				select {
				case w <- struct{}{}:
				default:
				}
			}
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

// localQueues makes the waiters of one resource in this process queue up,
// so that only one of them at a time contends in Redis.
type localQueues struct {
	mu     sync.Mutex
	queues map[string]*localQueue
	max    int          // waiters per resource at most; 0: no limit
	active atomic.Int64 // len(queues), read without the lock by busy
}

type localQueue struct {
	turn    chan struct{} // holds the token while no waiter contends
	members int
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
