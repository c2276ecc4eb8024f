package manager

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/sharding"
)

// attemptSingle makes one acquire attempt of an exclusive lock: one round trip, or two for a contended
// first try that must tell a replay apart.
//
// A first try (firstTry) sends SET NX PX, whose "OK" is the uncontended
// path's whole cost. A nil reply means another token holds the key, or
// ours does: go-redis re-sends a command whose reply was lost, so a SET
// that ran may answer nil. Unless the caller queues next (queueNext: the
// queue script tells a replay apart), a GET finds out. Later tries send
// SET NX PX GET, which answers both in one reply.
func (m *Manager) attemptSingle(ctx context.Context, a *attemptArgs) (status int, fence uint64, replicas int, err error) {
	key, token, tokenArg, ac, firstTry, queueNext := a.tg.key, a.token, a.tokenArg, a.ac, a.firstTry, a.queueNext
	ttlMs := ac.ttlMs
	if m.cfg.replicas > 0 {
		return m.attemptWait(ctx, key, token, ttlMs, ac)
	}
	if ac.fencing {
		res, err := scripts.AcquireFenced.Run(transport.WithTryAgainFallback(ctx), m.cmd, []string{key, sharding.FenceKey(key)}, tokenArg, ttlMs).Slice()
		if transport.IsTryAgain(err) {
			// The key and its counter are apart while the slot migrates.
			status, fences, _, err := m.attemptBatchKeys(ctx, &batchInfo{keys: []string{key}}, tokenArg, ac, true, false)
			if len(fences) > 0 {
				fence = fences[0]
			}
			return status, fence, 0, err
		}
		status, fence, err := parseFenced(res, err)
		return status, fence, 0, err
	}
	// A command whose reply did not come in time belongs to the coalescer:
	// its error is all there is to read.
	if !firstTry {
		cmd := redis.NewStringCmd(ctx, "set", key, tokenArg, "px", ttlMs, "nx", "get")
		if err := m.cmd.Process(ctx, cmd); transport.IsAbandoned(err) {
			return 0, 0, 0, err
		}
		status, err = parseSetNXGet(cmd, token)
		return status, 0, 0, err
	}
	set := redis.NewStatusCmd(ctx, "set", key, tokenArg, "px", ttlMs, "nx")
	if err := m.cmd.Process(ctx, set); transport.IsAbandoned(err) {
		return 0, 0, 0, err
	}
	switch err := set.Err(); {
	case err == nil:
		return attemptFresh, 0, 0, nil
	case !errors.Is(err, redis.Nil):
		return 0, 0, 0, err
	case queueNext:
		return attemptContended, 0, 0, nil
	}
	get := redis.NewStringCmd(ctx, "get", key)
	if err := m.cmd.Process(ctx, get); transport.IsAbandoned(err) {
		return 0, 0, 0, err
	}
	status, err = parseGet(get, token)
	return status, 0, 0, err
}

// attemptWait writes the key and sends WAIT in one pipeline on the owning
// master, so WAIT counts the replicas that have this write.
func (m *Manager) attemptWait(ctx context.Context, key, token string, ttlMs any, ac *acquireConfig) (status int, fence uint64, replicas int, err error) {
	fencing := ac.fencing
	node, err := m.tr.MasterFor(ctx, key)
	if err != nil {
		return 0, 0, 0, err
	}
	pipe := node.Pipeline()
	var (
		set   *redis.StringCmd
		fcmd  *redis.Cmd
		waitc *redis.Cmd
	)
	if fencing {
		fcmd = scripts.AcquireFenced.Eval(ctx, pipe, []string{key, sharding.FenceKey(key)}, token, ttlMs)
	} else {
		set = redis.NewStringCmd(ctx, "set", key, token, "px", ttlMs, "nx", "get")
		_ = pipe.Process(ctx, set)
	}
	waitc = pipe.Do(ctx, "wait", m.cfg.replicas, m.cfg.replicaTimeout.Milliseconds())
	_, _ = pipe.Exec(ctx)
	if fencing {
		status, fence, err = parseFenced(fcmd.Slice())
	} else {
		status, err = parseSetNXGet(set, token)
	}
	if err != nil {
		return 0, 0, 0, err
	}
	if status == attemptContended {
		return status, fence, 0, nil // nothing was written: no WAIT to read
	}
	return status, fence, m.replicaCount(waitc, "acquire"), nil
}
