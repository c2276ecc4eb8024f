package manager

import (
	"context"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// kindBatchNative is kindBatch whose first try at a batch is MSETEX ... NX
// PX (Valkey 9.1 and later): every key set to the token with the TTL, or
// none, in one command the server runs without Lua. A reply of 0 (a key is
// held, perhaps by this very token after a lost reply), or an error reply,
// sends the attempt again as kindBatch's script, which says which keys are
// held, recognises its own token and answers TRYAGAIN's migrations key by
// key. Everything else (later tries, the fenced batch, a batch under
// WithReplicaAck, release, extend, TTL) is kindBatch's.
//
// acquireBatch chooses it for an unfenced batch when New found MSETEX on
// every master (Manager.msetex; on a cluster, only where every master
// routes it by its keys' slot: see msetexRoutes) and
// WithConditionalCommands is not off. On a cluster a redirect is followed
// (the coalescer), and TRYAGAIN, the slot migrating with the batch's keys
// not all on its target, sends the attempt to the script, which takes
// the batch key by key. A reply of "unknown command" turns it off for the
// Manager, as the conditional commands are (see scriptAfter).
var kindBatchNative lockKind = batchNativeKind{}

type batchNativeKind struct{ batchKind }

func (k batchNativeKind) attempt(m *Manager, ctx context.Context, a attemptArgs) (attemptResult, error) {
	// acquireBatch chose this kind for an unfenced batch only.
	if a.first && m.cfg.replicas == 0 && m.msetex.Load() {
		keys := a.tg.batch.keys
		args := make([]any, 0, 2+2*len(keys)+3)
		args = append(args, "msetex", strconv.Itoa(len(keys)))
		for _, key := range keys {
			args = append(args, key, a.tokenArg)
		}
		args = append(args, "nx", "px", a.ac.ttlMs)
		cmd := redis.NewIntCmd(ctx, args...)
		err := m.tr.Process(m.batchCtx(ctx, len(keys)), m.cmd, cmd)
		if err == nil && cmd.Val() == 1 {
			return attemptResult{status: attemptFresh}, nil
		}
		if err != nil && !m.scriptAfter(err, &m.msetex) {
			return attemptResult{}, err
		}
	}
	return k.batchKind.attempt(m, ctx, a)
}
