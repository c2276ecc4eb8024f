package manager

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/sharding"
)

// kindExclusive is the kind of a lock one holder at a time holds on one key: a
// string key whose value is the holder's token. It is acquired with SET NX
// PX (or the fenced script, or the queue script for a fair waiter:
// attempt_single.go, attempt_queued.go), released by release.lua, which
// hands the key over to a queued waiter, extended by extend.lua.
var kindExclusive lockKind = exclusiveKind{}

type exclusiveKind struct{}

func (exclusiveKind) attempt(m *Manager, ctx context.Context, a attemptArgs) (attemptResult, error) {
	return attemptExclusive(m, ctx, a, false)
}

// attemptExclusive is an exclusive lock's attempt: a fair waiter's
// (joining natively where native allows: attemptQueued) or a single one.
func attemptExclusive(m *Manager, ctx context.Context, a attemptArgs, native bool) (res attemptResult, err error) {
	if a.fw != nil {
		res.status, res.fence, err = m.attemptQueued(ctx, a.tg.key, a.fw, a.ac, native)
		return res, err
	}
	res.status, res.fence, res.replicas, err = m.attemptSingle(ctx, &a)
	return res, err
}

func (exclusiveKind) queues() bool       { return true }
func (exclusiveKind) fenced() bool       { return true }
func (exclusiveKind) holdsReaders() bool { return false }
func (exclusiveKind) handsOver() bool    { return true }
func (exclusiveKind) perKey() lockKind   { return kindExclusive }

func (exclusiveKind) queueMark(fencing bool) string { return luaFlag(fencing) }

func (exclusiveKind) leave(m *Manager, ctx context.Context, key, entry string) (bool, error) {
	n, err := m.client.LRem(ctx, sharding.QueueKey(key), 1, entry).Result()
	return n == 1, err
}

func (exclusiveKind) releaseCall(keys []string, token []any, entry string, local bool) transport.ScriptCall {
	if entry != "" {
		return transport.ScriptCall{Script: scripts.Release, Keys: keys, Args: []any{token[0], entry, luaArg(local)}}
	}
	return transport.ScriptCall{Script: scripts.Release, Keys: keys, Args: token}
}

func (exclusiveKind) releaseResult(_ *Lock, cmd *redis.Cmd, ambiguous bool, sentAt, validUntil time.Time) (error, int64, uint64, error) {
	return oneKeyReleaseResult(cmd, ambiguous, sentAt, validUntil)
}

func (exclusiveKind) extendCall(keys []string, token any, ttlMs string) transport.ScriptCall {
	return transport.ScriptCall{Script: scripts.Extend, Keys: keys, Args: []any{token, ttlMs}}
}

func (exclusiveKind) pttlCall(keys []string, token []any) transport.ScriptCall {
	return transport.ScriptCall{Script: scripts.PTTL, Keys: keys, Args: token}
}

// oneKeyReleaseResult reads the reply of a release call on one key
// (release.lua's, rw_release.lua's): see lockKind.releaseResult.
func oneKeyReleaseResult(cmd *redis.Cmd, ambiguous bool, sentAt, validUntil time.Time) (result error, code int64, fence uint64, err error) {
	code, fence, err = parseRelease(cmd.Result())
	if err != nil {
		return nil, 0, 0, err
	}
	return releaseResult(code, nil, ambiguous, sentAt, validUntil), code, fence, nil
}

func (k exclusiveKind) release(m *Manager, ctx context.Context, l *Lock, entry string, local, ambiguous bool, sentAt, validUntil time.Time) (error, int64, uint64, error) {
	return releaseBy(k, m, ctx, l, entry, local, ambiguous, sentAt, validUntil)
}

func (k exclusiveKind) extend(m *Manager, ctx context.Context, l *Lock, ttlMs string) (int64, error) {
	return extendBy(k, m, ctx, l, ttlMs)
}
