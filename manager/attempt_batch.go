package manager

import (
	"context"
	"errors"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/sharding"
)

// attemptBatch makes one batch acquire round trip for token (boxed as a
// script argument); a waiter (mark) marks the keys others hold, so that
// their release announces them free.
func (m *Manager) attemptBatch(ctx context.Context, b *batchInfo, token any, ac *acquireConfig, first, mark bool) (status int, fences []uint64, held []int, replicas int, err error) {
	keys, fencing := batchScriptKeys(b, ac.fencing)
	// A first attempt tries the keys as free before it reads them (the
	// cheapest script when the batch is free); a poll of a batch seen busy
	// reads first.
	try, marks := luaArg(first), luaArg(mark)
	if m.cfg.replicas > 0 {
		acq, waitc, err := m.evalWithWait(ctx, b.keys[0], scripts.AcquireBatch, keys, token, ac.ttlMs, fencing, try, marks)
		if err != nil {
			return 0, nil, nil, 0, err
		}
		res, err := acq.Result()
		if err != nil {
			return 0, nil, nil, 0, err
		}
		if status, fences, held, err = parseBatchReply(res, ac.fencing); err == nil && status != attemptContended {
			replicas = m.replicaCount(waitc, "acquire")
		}
		return status, fences, held, replicas, err
	}
	res, err := scripts.AcquireBatch.Run(m.batchCtx(ctx, len(keys)), m.cmd, keys, token, ac.ttlMs, fencing, try, marks).Result()
	if transport.IsTryAgain(err) {
		status, fences, held, err = m.attemptBatchKeys(ctx, b, token, ac, first, mark)
		return status, fences, held, 0, err
	} else if err != nil {
		return 0, nil, nil, 0, err
	}
	status, fences, held, err = parseBatchReply(res, ac.fencing)
	return status, fences, held, 0, err
}

// batchCtx is ctx for a batch's acquire command on n keys (MSETEX or the
// script): on a cluster, one whose TRYAGAIN (its slot migrating, the keys
// not all on the target) comes back to the caller, which takes another
// way (after MSETEX the script; after the script the keys one by one,
// attemptBatchKeys), rather than being sent again until ctx ends. One
// server never answers TRYAGAIN: ctx as it is.
func (m *Manager) batchCtx(ctx context.Context, n int) context.Context {
	if n > 1 && m.tr.Cluster() != nil {
		return transport.WithTryAgainFallback(ctx)
	}
	return ctx
}

// attemptBatchKeys is a batch's attempt (or a fenced lock's, a batch of
// one) while its slot migrates and Redis answers TRYAGAIN to the acquire
// script: on the slot's target, a script whose keys are not all there yet
// (free keys are not there either, and a fence counter may be on either
// node). It makes the unfenced batch attempt (attemptBatch) on each key
// alone, in order, which each node serves (a key that has left the source
// is redirected to the target), and holds the batch once every key holds
// the token. At the first key another token holds it stops, releases the
// keys it took (release.lua, one by one) and reports that key as held;
// the other keys are not looked at.
//
// With fencing, once it holds every key, it takes each key's fence alone
// (take_fence.lua), on whichever node has the counter. Fences still rise:
// every holder takes its fence while it holds the key, whether in one
// script or in two, and the counter is on one node at a time (MIGRATE
// moves a key atomically). A fence that fails releases the keys.
func (m *Manager) attemptBatchKeys(ctx context.Context, b *batchInfo, token any, ac *acquireConfig, first, mark bool) (status int, fences []uint64, held []int, err error) {
	plain := *ac
	plain.fencing = false
	status = attemptReplay
	for i, k := range b.keys {
		st, _, _, _, err := m.attemptBatch(ctx, &batchInfo{keys: []string{k}}, token, &plain, first, mark)
		if err != nil || st == attemptContended {
			if uerr := m.undoBatchKeys(ctx, b.keys[:i], token); err == nil {
				err = uerr
			}
			if err != nil {
				return 0, nil, nil, err
			}
			return attemptContended, nil, []int{i + 1}, nil
		}
		if st == attemptFresh {
			status = attemptFresh
		}
	}
	if !ac.fencing {
		return status, nil, nil, nil
	}
	fences = make([]uint64, len(b.keys))
	for i, k := range b.keys {
		f, err := scripts.TakeFence.Run(ctx, m.cmd, []string{sharding.FenceKey(k)}, ac.ttl.Milliseconds()).Int64()
		if err != nil {
			if uerr := m.undoBatchKeys(ctx, b.keys, token); uerr != nil {
				err = errors.Join(err, uerr)
			}
			return 0, nil, nil, err
		}
		fences[i] = uint64(f)
	}
	return status, fences, nil, nil
}

// undoBatchKeys releases keys, which an attempt of attemptBatchKeys took
// for token, one by one; it returns the first error (the acquirer settles
// an attempt whose keys may still be held, as for any ambiguous attempt).
func (m *Manager) undoBatchKeys(ctx context.Context, keys []string, token any) error {
	var first error
	for _, k := range keys {
		if err := m.tr.RunScript(ctx, m.cmd, scripts.Release, []string{k}, token).Err(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// batchScriptKeys returns the keys and the fencing argument of
// acquire_batch.lua for b.
func batchScriptKeys(b *batchInfo, fencing bool) ([]string, any) {
	if !fencing {
		return b.keys, luaFalse
	}
	keys := make([]string, 0, 2*len(b.keys))
	keys = append(keys, b.keys...)
	for _, k := range b.keys {
		keys = append(keys, sharding.FenceKey(k))
	}
	return keys, luaTrue
}
