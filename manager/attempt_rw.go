package manager

import (
	"context"

	"github.com/shardlock/shardlock/internal/scripts"
)

// attemptRW makes one attempt at a read-write lock: a fair waiter's (its
// entry queued, or re-checked), or a plain one. A waiting writer that does
// not queue (it polls) holds new readers back until about its next poll.
//
// Under WithReplicaAck the script and a WAIT go in one pipeline to the
// owning master, as an exclusive lock's attempt does (attemptWait).
func (m *Manager) attemptRW(ctx context.Context, a *attemptArgs) (status int, fence uint64, replicas int, err error) {
	entry, recheck, hold := "", false, "0"
	if w := a.fw; w != nil {
		var skip bool
		entry, recheck, skip = m.queues.markQueued(w, a.sendAt)
		if skip {
			return attemptContended, 0, 0, nil
		}
	} else if a.tg.rw == rwWrite && a.hold > 0 {
		hold = formatMs(a.hold)
	}
	keys := []string{a.tg.key}
	args := []any{a.tokenArg, a.ac.ttlMs, a.tg.rw.arg(), luaArg(a.ac.fencing), entry, luaArg(recheck), hold}
	if m.cfg.replicas > 0 {
		cmd, waitc, werr := m.evalWithWait(ctx, a.tg.key, scripts.RWAcquire, keys, args...)
		if werr != nil {
			return 0, 0, 0, werr
		}
		status, fence, err = parseFenced(cmd.Slice())
		if err == nil && status != attemptContended {
			replicas = m.replicaCount(waitc, "acquire")
		}
	} else {
		status, fence, err = parseFenced(scripts.RWAcquire.Run(ctx, m.cmd, keys, args...).Slice())
	}
	if a.fw != nil {
		m.afterQueuedAttempt(a.tg.key, a.fw, entry, recheck, status, fence, err)
	}
	if status == attemptContended {
		fence = 0
	}
	return status, fence, replicas, err
}
