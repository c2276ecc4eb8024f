package manager

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/sharding"
)

// The fair queue in the conditional commands of newer servers (Valkey 9,
// Redis 8.4): the steps of a contended, unfenced exclusive lock with the
// conditional SET (the join without Lua, the hand-over in one small
// script), on the queue that the scripts keep (queue.go, handover.lua), in
// the same format, so that Managers on either path share one queue.
//
// A waiter at a key its process saw contended lately joins with RPUSHX: it
// puts its entry on the queue if the queue exists, which it does while
// waiters are handed the lock in turn (the release that finds it empty
// deletes the key, and Redis the empty list). Where there is no queue, the
// attempt goes by acquire_queue.lua, which takes a free key, or creates the
// queue with its expiry and sets the mark in one step; so do a process's
// first waiter, a re-check and a fencing waiter. A waiter queued behind a
// holder that died or lost the key, or behind one that then took the free
// key with SET NX (no mark: its release is a conditional delete), is not handed it: it
// finds the key by its re-checks, as a waiter whose announcement was lost
// does.
//
// A holder handed the lock from the queue (its key holds its token with
// the queued mark) hands it on with hand_on.lua, in one round trip: LPOP,
// SET of the popped waiter's token (with the mark, on the claim lease)
// IFEQ its own, and SPUBLISH of the hand-over on that waiter's channel.
// The announcement must not go out before the key is the waiter's, and
// only a script sends it in the same step as the conditional SET: the
// same three commands sent one by one, each after the previous one's
// reply, take three round trips, and the waiter hears of its lock two
// round trips later. An empty queue makes it
// the conditional delete (DELIFEQ or DELEX ... IFEQ, condDel) and the
// "free" announcement. Entries past their deadline, by this process's
// clock, and junk are dropped, as release.lua drops them; a fencing
// waiter's entry is put back and the release goes by release.lua, which
// takes its fence. Unlike release.lua, hand_on.lua announces to the new
// holder's Manager only, not to the two waiters behind it: a waiter that
// died while queued costs the next one its next re-check (fairRecheck and
// the retry strategy) rather than one claim lease.
//
// Every reply that says the key is not as expected (it expired, was
// force-released, holds another token) sends the call by release.lua,
// which tells those apart; a popped entry is put back first.

// queueTTLSlack is how far past a joining waiter's deadline the native
// join sets the queue's expiry when it extends it: further joins of this
// Manager's waiters, whose deadlines come within that slack, push their
// entries with RPUSHX alone.
const queueTTLSlack = 10 * time.Second

// joinNative puts fair waiter w's entry on key's queue if the queue
// exists (see above). ok false: nothing was queued, and the caller makes
// the attempt by the script.
func (m *Manager) joinNative(ctx context.Context, key string, w *fairWaiter, entry string) (ok bool, err error) {
	q := sharding.QueueKey(key)
	push := redis.NewIntCmd(ctx, "rpushx", q, entry)
	if err := m.tr.Process(ctx, m.cmd, push); err != nil {
		if transport.IsReply(err) && !transport.IsTransient(err) {
			return false, nil // a queue key of another type: the script's answer
		}
		return true, err
	}
	if push.Val() == 0 {
		return false, nil
	}
	m.extendQueue(ctx, key, q, w.deadline)
	return true, nil
}

// extendQueue makes sure queue q of key lives until deadline: it extends
// it (PEXPIREAT ... GT) unless this Manager extended it that far already.
// A queue deleted and made anew by another Manager since may expire
// earlier: its waiters then find the lock by their re-checks.
func (m *Manager) extendQueue(ctx context.Context, key, q string, deadline time.Time) {
	if m.queues.queueLives(key, deadline) {
		return
	}
	until := deadline.Add(queueTTLSlack)
	exp := redis.NewIntCmd(ctx, "pexpireat", q, until.UnixMilli(), "gt")
	if m.tr.Process(ctx, m.cmd, exp) == nil {
		m.queues.queueExtended(key, until)
	}
}

// releaseQueuedNative releases l, a lock handed over from the queue, by
// hand_on.lua or, with nobody queued, the conditional delete (see above).
// ok false: the release is to go by release.lua (nothing was changed but,
// possibly, dead entries dropped).
func (m *Manager) releaseQueuedNative(ctx context.Context, l *Lock) (code int64, ok bool, err error) {
	mine := l.token + sharding.QueuedMark
	r, err := scripts.HandOn.Run(ctx, m.cmd, l.scriptKeys(), mine, time.Now().UnixMilli(), scripts.ClaimLease.Milliseconds()).Int64()
	switch {
	case err != nil:
		if transport.IsReply(err) && !transport.IsTransient(err) {
			m.scriptAfter(err, &m.conditional)
			return 0, false, nil
		}
		return 0, true, err // the SET may have run: its waiter finds its token on a re-check
	case r == 1:
		return scripts.HandedOver, true, nil
	case r != 0:
		return 0, false, nil
	}
	del := m.condDel(ctx, l.key, mine)
	err = m.tr.Process(ctx, m.cmd, del)
	if err == nil && del.Val() == 1 {
		_ = m.tr.Process(ctx, m.cmd, redis.NewIntCmd(ctx, "spublish", sharding.ChannelName(l.key), "free"))
		return scripts.Done, true, nil
	}
	if err != nil && !m.scriptAfter(err, &m.conditional) {
		return 0, true, err
	}
	return 0, false, nil
}
