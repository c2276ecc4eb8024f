package manager

import (
	"context"
	"time"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/sharding"
)

// attemptQueued runs acquire_queue.lua for w: take the key if free, else
// queue w's entry (or, on a re-check, make sure it is queued). native: an
// unfenced waiter's first attempt at a key this process saw contended
// lately, whose queue is then most likely in use, joins that queue without
// the script where it can (joinNative).
func (m *Manager) attemptQueued(ctx context.Context, key string, w *fairWaiter, ac *acquireConfig, native bool) (status int, fence uint64, err error) {
	entry, recheck, skip := m.queues.markQueued(w, time.Now())
	if skip {
		return attemptContended, 0, nil // a local release is handing w the lock: wait for it
	}
	if native && !recheck && !ac.fencing && m.queues.contended(key) {
		if ok, err := m.joinNative(ctx, key, w, entry); ok {
			m.afterQueuedAttempt(key, w, entry, false, attemptContended, 0, err)
			return attemptContended, 0, err
		}
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
