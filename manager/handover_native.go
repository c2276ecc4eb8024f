package manager

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/sharding"
)

// The fair queue in the conditional commands of newer servers (Valkey 9):
// the steps of a contended, unfenced exclusive lock without Lua, on the
// queue that the scripts keep (queue.go, handover.lua), in the same
// format, so that Managers on either path share one queue.
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
// the queued mark) releases with LPOP, then SET of the popped waiter's
// token (with the mark, on the claim lease) IFEQ its own, then SPUBLISH of
// the hand-over on that waiter's channel: three commands in three round
// trips, since the announcement must not go out before the key is the
// waiter's. An empty queue makes it the conditional delete (DELIFEQ or
// DELEX ... IFEQ, condDel) and the "free" announcement.
// Entries past their deadline, by this process's clock, and junk are
// dropped, as the script drops them; a fencing waiter's entry is pushed
// back (pushBack) and the release goes by the script, which takes its
// fence. Unlike the script, the native hand-over announces to the new
// holder's Manager only, not to the two waiters behind it: a waiter that
// died while queued costs the next one its next re-check (fairRecheck and
// the retry strategy) rather than one claim lease.
//
// Every reply that says the key is not as expected (it expired, was
// force-released, holds another token) sends the call by the script,
// which tells those apart; a popped entry is pushed back first.

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

// nativePops bounds the entries one native release pops, as the script's.
const nativePops = 64

// releaseQueuedNative releases l, a lock handed over from the queue, in
// the conditional commands (see above). ok false: the release is to go by
// the script (nothing was changed but, possibly, dead entries dropped).
func (m *Manager) releaseQueuedNative(ctx context.Context, l *Lock) (code int64, ok bool, err error) {
	q := sharding.QueueKey(l.key)
	mine := l.token + sharding.QueuedMark
	now := time.Now().UnixMilli()
	for range nativePops {
		pop := redis.NewStringCmd(ctx, "lpop", q)
		err := m.tr.Process(ctx, m.cmd, pop)
		if err == redis.Nil {
			break
		}
		if err != nil {
			if transport.IsReply(err) && !transport.IsTransient(err) {
				return 0, false, nil
			}
			return 0, true, err
		}
		e := pop.Val()
		tok, owner, ttl, fencing, deadline, valid := parseEntry(e)
		if !valid || deadline < now {
			continue // dropped, as the script drops it
		}
		if fencing {
			m.pushBack(ctx, q, e)
			return 0, false, nil
		}
		set := redis.NewStatusCmd(ctx, "set", l.key, tok+sharding.QueuedMark, "ifeq", mine,
			"px", min(ttl, scripts.ClaimLease.Milliseconds()))
		err = m.tr.Process(ctx, m.cmd, set)
		if err == nil {
			m.announceHandover(ctx, l.key, tok, owner)
			return scripts.HandedOver, true, nil
		}
		if err == redis.Nil || transport.IsReply(err) && !transport.IsTransient(err) {
			// Not written: the entry goes back, and the script tells
			// what became of the key.
			m.pushBack(ctx, q, e)
			if err != redis.Nil {
				m.scriptAfter(err, &m.conditional)
			}
			return 0, false, nil
		}
		// The SET may have run: its waiter finds its token on a re-check.
		return 0, true, err
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

// pushBack puts entry e back at the head of queue q, where it was popped
// from, if q still exists (LPUSHX: a queue that the pop emptied is gone,
// and one made anew here would have no expiry). An entry that is not put
// back, or fails to be, leaves its waiter to find the lock by its
// re-checks, or by the "free" announcement of the script's release.
func (m *Manager) pushBack(ctx context.Context, q, e string) {
	_ = m.tr.Process(ctx, m.cmd, redis.NewIntCmd(ctx, "lpushx", q, e))
}

// announceHandover tells owner's Manager that token tok holds key (as
// announce.lua does, with no fence): "<sha1 of tok> 0" on its hand-over
// channel. A lost announcement is found by the waiter's re-check.
func (m *Manager) announceHandover(ctx context.Context, key, tok, owner string) {
	sum := sha1.Sum([]byte(tok))
	_ = m.tr.Process(ctx, m.cmd, redis.NewIntCmd(ctx, "spublish", sharding.HandoverChannel(key, owner), hex.EncodeToString(sum[:])+" 0"))
}

// parseEntry reads a queue entry (cutEntry): valid false for junk, which
// is dropped, as handover.lua's entry_parts has it.
func parseEntry(e string) (tok, owner string, ttlMs int64, fencing bool, deadlineMs int64, valid bool) {
	d, t, f, tok, ok := cutEntry(e)
	if !ok || (f != "0" && f != "1") {
		return "", "", 0, false, 0, false
	}
	deadlineMs, err1 := strconv.ParseInt(d, 10, 64)
	ttlMs, err2 := strconv.ParseInt(t, 10, 64)
	if err1 != nil || err2 != nil || ttlMs < 1 || ttlMs > 86400000 {
		return "", "", 0, false, 0, false
	}
	owner, ok = tokenOwner(tok)
	if !ok || strings.HasSuffix(tok, sharding.QueuedMark) {
		return "", "", 0, false, 0, false
	}
	return tok, owner, ttlMs, f == "1", deadlineMs, true
}
