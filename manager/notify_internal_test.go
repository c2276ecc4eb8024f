package manager

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shardlock/shardlock/internal/testenv"
	"github.com/shardlock/shardlock/sharding"
)

// A subscription connection that goes without a message pings the server
// (so that go-redis finds a dead connection and dials again).
func TestIdleSubscriptionPings(t *testing.T) {
	name := testenv.Unique("pinger")
	c := redis.NewClient(&redis.Options{Addr: testenv.StandaloneAddr(t), ClientName: name})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := New(ctx, c, WithRetry(LinearBackoff(5*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	m.notify.healthCheck = 50 * time.Millisecond // before the first subscription starts its goroutine
	res := testenv.Unique("idle")
	h, err := m.TryAcquire(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	got := acquireReleasing(ctx, m, res)
	// The subscription connection's last command turns from SSUBSCRIBE to
	// PING.
	deadline := time.Now().Add(5 * time.Second)
	for {
		list, err := c.ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if pinged(list, name) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the idle subscription connection did not ping:\n%s", list)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// pinged reports whether CLIENT LIST's list has a connection named name,
// subscribed to a sharded channel, whose last command was PING.
func pinged(list, name string) bool {
	for line := range strings.SplitSeq(list, "\n") {
		f := strings.Fields(line)
		subscribed := slices.ContainsFunc(f, func(s string) bool { return strings.HasPrefix(s, "ssub=") && s != "ssub=0" })
		if slices.Contains(f, "name="+name) && subscribed && slices.Contains(f, "cmd=ping") {
			return true
		}
	}
	return false
}

// Waiters on many resources share one subscription connection per node.
func TestOneSubscriptionPerNode(t *testing.T) {
	c := testenv.Cluster(t)
	m, err := New(context.Background(), c, WithRetry(LinearBackoff(5*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	prefix := testenv.Unique("sub")
	done := make(chan struct{}, 30)
	for i := range 30 {
		res := fmt.Sprintf("%s-%d", prefix, i)
		if _, err := m.TryAcquire(ctx, res); err != nil {
			t.Fatal(err)
		}
		go func() {
			_, _ = m.Acquire(ctx, res)
			done <- struct{}{}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		m.notify.mu.Lock()
		chans, nodes := len(m.notify.chans), len(m.notify.nodes)
		m.notify.mu.Unlock()
		if chans == 2*30 { // each lock's channel and this Manager's hand-over channel of it
			if nodes > 3 {
				t.Fatalf("%d subscription connections for 3 masters", nodes)
			}
			t.Logf("30 waiters on 30 resources: %d subscription connections", nodes)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d channels watched", chans)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	for range 30 {
		<-done
	}
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A channel stays subscribed for a while after its last waiter leaves: a
// process that waits for the same lock again and again subscribes once.
func TestSubscriptionLingers(t *testing.T) {
	for _, target := range testenv.Targets() {
		if target.Name == "sentinel" {
			continue
		}
		t.Run(target.Name, func(t *testing.T) {
			c := target.Client(t)
			m, err := New(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close(context.Background())
			other, err := New(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close(context.Background())
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res := testenv.Unique("linger")
			key, _ := m.lockKey(res)
			for range 3 {
				h, err := other.TryAcquire(ctx, res)
				if err != nil {
					t.Fatal(err)
				}
				got := acquireReleasing(ctx, m, res)
				deadline := time.Now().Add(5 * time.Second)
				for c.LLen(ctx, sharding.QueueKey(key)).Val() == 0 && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
				if err := h.Release(ctx); err != nil {
					t.Fatal(err)
				}
				if err := <-got; err != nil {
					t.Fatal(err)
				}
			}
			// The lock's channel and m's hand-over channel of it, once each.
			if s, u := m.notify.subscribes.Load(), m.notify.unsubscribes.Load(); s != 2 || u != 0 {
				t.Fatalf("3 waits: %d SSUBSCRIBE, %d SUNSUBSCRIBE; want 2 and 0", s, u)
			}
			m.notify.mu.Lock()
			idle := m.notify.idle
			m.notify.mu.Unlock()
			if idle != 2 {
				t.Fatalf("%d channels linger, want 2", idle)
			}
		})
	}
}

// A waiter whose re-check finds the lock handed to it, with no
// announcement heard, subscribes its channels again: its subscription may
// be gone without a word (a failed-over node, or a connection made again to
// a node that no longer serves the slot). Here the notifier is made to
// believe the channel subscribed on another master, as it would after a
// failover; once the channel is subscribed on its own master again, the
// other master's subscription connection, which nothing uses any more, is
// closed. For an exclusive lock and a read-write lock's writer.
func TestMissedHandOverSubscribesAgain(t *testing.T) {
	t.Run("exclusive", func(t *testing.T) {
		missedHandOver(t, (*Manager).TryAcquire, (*Manager).Acquire)
	})
	t.Run("writer", func(t *testing.T) {
		missedHandOver(t, (*Manager).TryAcquireWrite, (*Manager).AcquireWrite)
	})
}

type acquireFunc func(*Manager, context.Context, string, ...AcquireOption) (*Lock, error)

func missedHandOver(t *testing.T, try, acquire acquireFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holder, err := New(ctx, testenv.Cluster(t))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	cc := testenv.Cluster(t)
	m, err := New(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	res := testenv.Unique("missed")
	h, err := try(holder, ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	key := h.Key()
	ch := sharding.HandoverChannel(key, m.cfg.owner) // where m hears its hand-overs
	owner, other := testenv.MastersOf(t, ctx, cc, key)
	subscribers := func() int64 {
		v, err := owner.Do(ctx, "pubsub", "shardnumsub", ch).Slice()
		if err != nil || len(v) != 2 {
			return -1
		}
		n, _ := v[1].(int64)
		return n
	}
	// Two waiters: the second keeps the channel watched once the first
	// has the lock.
	got := make(chan *Lock, 2)
	for range 2 {
		go func() {
			l, err := acquire(m, ctx, res)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
		}
	}
	// The server counts the subscription before the notifier has read its
	// confirmation: wait for both.
	confirmed := func() bool {
		m.notify.mu.Lock()
		defer m.notify.mu.Unlock()
		cw := m.notify.chans[ch]
		return cw != nil && cw.node != nil
	}
	eventually("the waiter never queued", func() bool {
		info, err := holder.Inspect(ctx, res)
		return err == nil && info.Waiters == 1 && subscribers() == 1 && confirmed()
	})
	// The notifier believes the channel subscribed on the other master;
	// its own master no longer has the subscription.
	gone := m.notify.nodeSub(other, &subscribing{})
	m.notify.mu.Lock()
	real := m.notify.chans[ch].node
	m.notify.chans[ch].node = gone
	m.notify.mu.Unlock()
	if err := real.ps.SUnsubscribe(ctx, ch); err != nil {
		t.Fatal(err)
	}
	eventually("the subscription is still there", func() bool { return subscribers() == 0 })
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := <-got
	if first == nil {
		t.FailNow()
	}
	eventually("the channel was not subscribed again after the missed hand-over", func() bool { return subscribers() == 1 })
	eventually("the other master's subscription connection is still open", func() bool {
		m.notify.mu.Lock()
		defer m.notify.mu.Unlock()
		return m.notify.nodes[other.Options().Addr] == nil
	})
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if second := <-got; second != nil {
		_ = second.Release(ctx)
	}
}

// A server that refuses the channel (an ACL user without channel
// permissions, as Redis 7 makes them by default) answers SSUBSCRIBE with
// NOPERM, which go-redis's pub/sub drops unseen: the subscription is never
// confirmed. After a round of attempts, the waiter's refreshes leave the
// channel alone for subscribeCooldown rather than start a round after
// every re-check; the waiter, which cannot hear, still takes the lock when
// it is released (its re-check finds it).
func TestRefusedSubscriptionCoolsDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	user := testenv.Unique("nochan")
	for _, addr := range testenv.ClusterAddrs(t) {
		n := redis.NewClient(&redis.Options{Addr: addr})
		if err := n.Do(ctx, "acl", "setuser", user, "on", ">pw", "~*", "+@all", "resetchannels").Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = n.Do(context.Background(), "acl", "deluser", user).Err()
			_ = n.Close()
		})
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.ClusterAddrs(t), Username: user, Password: "pw", ContextTimeoutEnabled: true})
	defer c.Close()
	m, err := New(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	holder, err := New(ctx, testenv.Cluster(t))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	res := testenv.Unique("refused")
	h, err := holder.TryAcquire(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	chs := m.notify.channels(h.Key())
	got := acquireReleasing(ctx, m, res)
	failed := func() bool {
		m.notify.mu.Lock()
		defer m.notify.mu.Unlock()
		for _, ch := range chs {
			if cw := m.notify.chans[ch]; cw == nil || cw.failedAt.IsZero() {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(10 * time.Second); !failed(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the refused subscription never gave up")
		}
	}
	sent := m.notify.subscribes.Load()
	if sent != int64(len(chs))*subscribeAttempts {
		t.Fatalf("%d SSUBSCRIBE in the rounds of %d channels, want %d each", sent, len(chs), subscribeAttempts)
	}
	// The waiter re-checks every 100 ms meanwhile, and each re-check's
	// refresh would start another round.
	time.Sleep(time.Second)
	if again := m.notify.subscribes.Load() - sent; again != 0 {
		t.Fatalf("%d more SSUBSCRIBE within 1 s of a round that failed", again)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not take the lock after its release")
	}
}

// acquireReleasing makes m's Acquire of res, then releases the lock, in the
// background, and sends the first error (or nil).
func acquireReleasing(ctx context.Context, m *Manager, res string) <-chan error {
	got := make(chan error, 1)
	go func() {
		l, err := m.Acquire(ctx, res)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	return got
}

// A slot that leaves a node just after the node confirmed a channel's
// subscription, before the notifier recorded it, takes the channel with
// it (the server says "sunsubscribe"): the channel is subscribed again,
// not taken as subscribed on a node that no longer serves it. Here the
// drop is delivered at that moment by the test.
func TestDroppedBeforeRecordedSubscribesAgain(t *testing.T) {
	c := testenv.Cluster(t)
	m, err := New(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res := testenv.Unique("dropped")
	key, _ := m.lockKey(res)
	lockCh := sharding.ChannelName(key)
	drops := make(chan struct{}, 1)
	m.notify.subscribed = func(ch string, ns *nodeSub) {
		select {
		case drops <- struct{}{}:
			if ch == lockCh {
				m.notify.deliver(ns, &redis.Subscription{Kind: "sunsubscribe", Channel: ch})
				return
			}
			<-drops // not the lock's channel: let the next one be dropped
		default:
		}
	}
	h, err := m.TryAcquire(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	wait, stop := context.WithCancel(ctx)
	defer stop()
	got := make(chan error, 1)
	go func() {
		_, err := m.Acquire(wait, res)
		got <- err
	}()
	// The first subscription of the lock's channel is dropped; a second
	// one must follow (bounded: the re-subscription's attempts take under
	// a second).
	deadline := time.Now().Add(10 * time.Second)
	for !(len(drops) == 1 && m.notify.subscribes.Load() >= 3 && m.notify.hearing(key)) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if len(drops) != 1 {
		t.Fatal("the lock's channel was never subscribed")
	}
	if s := m.notify.subscribes.Load(); s < 3 || !m.notify.hearing(key) {
		t.Fatalf("%d SSUBSCRIBE after the drop, hearing %v; want the lock's channel subscribed again", s, m.notify.hearing(key))
	}
	stop()
	<-got
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
