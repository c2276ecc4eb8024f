package manager

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/sharding"
)

// kindExclusiveNative is kindExclusive spoken in the conditional commands
// of newer servers, where every master has them (Valkey 9.0 and later,
// Redis 8.4 and later): a release of a lock nobody queued for is DELIFEQ
// (Valkey) or DELEX ... IFEQ (Redis), an extend is SET ... IFEQ ... PX. Both are single-key commands the server runs without Lua.
// A fair waiter's first attempt joins the queue, and a lock that came
// through the queue is handed on, in the same commands where the Lock
// knows what its key holds (handover_native.go). When one answers that it
// did nothing (the key is gone, holds another token, was force-released,
// or carries the queued mark), or answers an error, the call goes again as
// kindExclusive's script, which tells these apart (and hands the lock to a
// queued waiter): the results and errors callers see are the script
// path's. Everything else (the uncontended acquire, a fair waiter's
// re-checks, a release that queues this process's next waiter, the
// watchdog's pipelined renewals, Close's releases, and the release and
// extend of a lock taken by the queue script, whose key may or may not
// carry the queued mark) is kindExclusive's.
//
// acquire chooses it for an unfenced exclusive lock when New found the
// commands on every master (serverCommands) and WithConditionalCommands
// is not off. A reply of "unknown command" (a master failed over to an
// older replica, or the command was renamed away) turns it off for the
// Manager, with one log line; the call goes by the script, and the Manager
// looks at the masters' command tables again later (recheckServerCmds).
var kindExclusiveNative lockKind = exclusiveNativeKind{}

type exclusiveNativeKind struct{ exclusiveKind }

func (exclusiveNativeKind) attempt(m *Manager, ctx context.Context, a attemptArgs) (attemptResult, error) {
	return attemptExclusive(m, ctx, a, m.conditional.Load())
}

func (exclusiveNativeKind) release(m *Manager, ctx context.Context, l *Lock, entry string, local, ambiguous bool, sentAt, validUntil time.Time) (error, int64, uint64, error) {
	switch {
	case entry != "" || !m.conditional.Load():
	case l.handed:
		code, ok, err := m.releaseQueuedNative(ctx, l)
		if err != nil {
			return nil, 0, 0, err
		}
		if ok {
			return nil, code, 0, nil
		}
	case !l.viaQueue:
		cmd := m.condDel(ctx, l.key, l.args[0])
		err := m.tr.Process(ctx, m.cmd, cmd)
		if err == nil && cmd.Val() == 1 {
			return nil, scripts.Done, 0, nil
		}
		if err != nil && !m.scriptAfter(err, &m.conditional) {
			return nil, 0, 0, err
		}
	}
	return releaseBy(kindExclusive, m, ctx, l, entry, local, ambiguous, sentAt, validUntil)
}

func (exclusiveNativeKind) extend(m *Manager, ctx context.Context, l *Lock, ttlMs string) (int64, error) {
	if (!l.viaQueue || l.handed) && m.conditional.Load() {
		val := l.token
		if l.handed {
			val += sharding.QueuedMark
		}
		cmd := redis.NewStatusCmd(ctx, "set", l.key, val, "ifeq", val, "px", ttlMs)
		err := m.tr.Process(ctx, m.cmd, cmd)
		if err == nil {
			return scripts.Done, nil
		}
		if err != redis.Nil && !m.scriptAfter(err, &m.conditional) {
			return 0, err
		}
	}
	return extendBy(kindExclusive, m, ctx, l, ttlMs)
}
