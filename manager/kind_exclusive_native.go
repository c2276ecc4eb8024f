package manager

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
)

// kindExclusiveNative is kindExclusive spoken in the conditional commands
// of newer servers, where every master has them (Valkey 9.0 and later): a
// release of a lock nobody queued for is DELIFEQ, an extend is SET ...
// IFEQ ... PX. Both are single-key commands the server runs without Lua.
// When one answers that it did nothing (the key is gone, holds another
// token, was force-released, or carries the queued mark), or answers an
// error, the call goes again as kindExclusive's script, which tells these
// apart (and hands the lock to a queued waiter): the results and errors
// callers see are the script path's. Everything else (the acquire, a
// release that queues this process's next waiter, the watchdog's
// pipelined renewals, Close's releases) is kindExclusive's, and so are the
// release and extend of a lock that came through Redis's queue
// (Lock.viaQueue): its key carries the queued mark, which the conditional
// commands' bare token would not match.
//
// acquire chooses it for an unfenced exclusive lock when New found the
// commands on every master (serverCommands) and WithConditionalCommands
// is not off. A reply of "unknown command" (a master failed over to an
// older replica, or the command was renamed away) turns it off for the
// Manager, with one log line; the call goes by the script, and the Manager
// looks at the masters' command tables again later (recheckServerCmds).
var kindExclusiveNative lockKind = exclusiveNativeKind{}

type exclusiveNativeKind struct{ exclusiveKind }

func (exclusiveNativeKind) release(m *Manager, ctx context.Context, l *Lock, entry string, local, ambiguous bool, sentAt, validUntil time.Time) (error, int64, uint64, error) {
	if entry == "" && !l.viaQueue && m.conditional.Load() {
		cmd := redis.NewIntCmd(ctx, "delifeq", l.key, l.args[0])
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
	if !l.viaQueue && m.conditional.Load() {
		cmd := redis.NewStatusCmd(ctx, "set", l.key, l.args[0], "ifeq", l.args[0], "px", ttlMs)
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
