package manager

import (
	"context"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/transport"
)

// kindBatchNative is kindBatch whose first try at a batch is MSETEX ... NX
// PX (Valkey 9.1, Redis 8.4 and later): every key set to the token with
// the TTL, or none, in one command the server runs without Lua. A reply of
// 0 (a key is held, perhaps by this very token after a lost reply), or an
// error reply, sends the attempt again as kindBatch's script, which says
// which keys are held, recognises its own token and answers TRYAGAIN's
// migrations key by key. Everything else (later tries, the fenced batch, a
// batch under WithReplicaAck, release, extend, TTL) is kindBatch's.
//
// acquireBatch chooses it for an unfenced batch when New found MSETEX on
// every master (Manager.msetex) and WithConditionalCommands is not off.
// On a cluster whose masters route MSETEX by its keys' slot (Redis 8.4),
// a redirect is followed (the coalescer), and TRYAGAIN, the slot migrating
// with the batch's keys not all on its target, sends the attempt to the
// script, which takes the batch key by key. A Valkey 9.1 master runs
// MSETEX whatever node serves its keys (msetexRoutes): there it goes in a
// transaction, MULTI, EXISTS of the batch's keys, MSETEX, EXEC (see
// msetexInTx). A reply of "unknown command" turns it off for the Manager,
// as the conditional commands are (see scriptAfter).
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
		var set bool
		var err error
		if m.msetexTx.Load() {
			set, err = m.msetexInTx(m.batchCtx(ctx, len(keys)), keys, args)
		} else {
			cmd := redis.NewIntCmd(ctx, args...)
			err = m.tr.Process(m.batchCtx(ctx, len(keys)), m.cmd, cmd)
			set = err == nil && cmd.Val() == 1
		}
		if set {
			return attemptResult{status: attemptFresh}, nil
		}
		if err != nil && !m.scriptAfter(err, &m.msetex) {
			return attemptResult{}, err
		}
	}
	return k.batchKind.attempt(m, ctx, a)
}

// msetexInTx runs MSETEX (args) in a transaction whose EXISTS names the
// batch's keys, and reports whether it set them. A cluster node checks
// every key of a transaction's commands against the slots it serves (at
// MULTI's queueing and again at EXEC): EXISTS makes a node that does not
// serve the keys' slot refuse the transaction (MOVED, ASK, or TRYAGAIN
// while the slot migrates, then EXECABORT), where MSETEX alone, whose keys
// a Valkey 9.1 node does not check, would set them on the wrong node. A
// refused transaction did nothing: its error, a reply, sends the attempt
// to the script, whose keys the node checks and whose redirects the
// coalescer follows. Any other error is the attempt's: the transaction may
// have run.
func (m *Manager) msetexInTx(ctx context.Context, keys []string, args []any) (set bool, err error) {
	exists := make([]any, 0, 1+len(keys))
	exists = append(exists, "exists")
	for _, key := range keys {
		exists = append(exists, key)
	}
	exec := redis.NewCmd(ctx, "exec")
	err = m.tr.ProcessGroup(ctx, m.cmd, redis.NewStatusCmd(ctx, "multi"), redis.NewCmd(ctx, exists...),
		redis.NewCmd(ctx, args...), exec)
	if transport.IsReply(err) {
		// The script answers every refusal in its own way; a refusal
		// that says the server lacks the command turns MSETEX off.
		m.scriptAfter(err, &m.msetex)
		return false, nil
	}
	if err != nil {
		return false, err
	}
	// EXEC answers with the replies of EXISTS and MSETEX.
	replies, _ := exec.Val().([]any)
	return len(replies) == 2 && replies[1] == int64(1), nil
}
