package manager

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
)

// kindReader and kindWriter are the kinds of a read-write lock's two sides: one
// hash per resource (see rw.lua) that readers share and a writer holds
// alone, with its own fair queue. Acquired by rw_acquire.lua, released by
// rw_release.lua, extended by rw_extend.lua. A release hands nothing to
// this process's next waiter directly: readers share the lock, and the
// script hands it over in Redis.
var (
	kindReader lockKind = rwKind{}
	kindWriter lockKind = rwKind{writer: true}
)

type rwKind struct{ writer bool }

// arg is the side as rw_acquire.lua takes it.
func (k rwKind) arg() string {
	if k.writer {
		return "w"
	}
	return "r"
}

func (k rwKind) attempt(m *Manager, ctx context.Context, a attemptArgs) (res attemptResult, err error) {
	res.status, res.fence, res.replicas, err = m.attemptRW(ctx, k, &a)
	return res, err
}

func (rwKind) queues() bool         { return true }
func (k rwKind) fenced() bool       { return k.writer } // readers take no fence
func (k rwKind) holdsReaders() bool { return k.writer }
func (rwKind) handsOver() bool      { return false }
func (k rwKind) perKey() lockKind   { return k }

// queueMark: a reader's entry says "r" in place of the fencing flag (see
// rw.lua).
func (k rwKind) queueMark(fencing bool) string {
	if k.writer {
		return luaFlag(fencing)
	}
	return "r"
}

func (rwKind) leave(m *Manager, ctx context.Context, key, entry string) (bool, error) {
	n, err := m.tr.RunScript(ctx, m.client, scripts.RWLeave, []string{key}, entry).Int64()
	return n == 1, err
}

func (rwKind) releaseCall(keys []string, token []any, _ string, _ bool) transport.ScriptCall {
	return transport.ScriptCall{Script: scripts.RWRelease, Keys: keys, Args: token}
}

func (rwKind) releaseResult(_ *Lock, cmd *redis.Cmd, ambiguous bool, sentAt, validUntil time.Time) (error, int64, uint64, error) {
	return oneKeyReleaseResult(cmd, ambiguous, sentAt, validUntil)
}

func (rwKind) extendCall(keys []string, token any, ttlMs string) transport.ScriptCall {
	return transport.ScriptCall{Script: scripts.RWExtend, Keys: keys, Args: []any{token, ttlMs}}
}

func (rwKind) pttlCall(keys []string, token []any) transport.ScriptCall {
	return transport.ScriptCall{Script: scripts.RWPTTL, Keys: keys, Args: token}
}

// attemptRW makes one attempt at a read-write lock: a fair waiter's (its
// entry queued, or re-checked), or a plain one. A waiting writer that does
// not queue (it polls) holds new readers back until about its next poll.
//
// Under WithReplicaAck the script and a WAIT go in one pipeline to the
// owning master, as an exclusive lock's attempt does (attemptWait).
func (m *Manager) attemptRW(ctx context.Context, k rwKind, a *attemptArgs) (status int, fence uint64, replicas int, err error) {
	entry, recheck, hold := "", false, "0"
	if w := a.fw; w != nil {
		var skip bool
		entry, recheck, skip = m.queues.markQueued(w, a.sendAt)
		if skip {
			return attemptContended, 0, 0, nil
		}
	} else if k.writer && a.hold > 0 {
		hold = formatMs(a.hold)
	}
	keys := []string{a.tg.key}
	args := []any{a.tokenArg, a.ac.ttlMs, k.arg(), luaArg(a.ac.fencing), entry, luaArg(recheck), hold}
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

func (k rwKind) release(m *Manager, ctx context.Context, l *Lock, entry string, local, ambiguous bool, sentAt, validUntil time.Time) (error, int64, uint64, error) {
	return releaseBy(k, m, ctx, l, entry, local, ambiguous, sentAt, validUntil)
}

func (k rwKind) extend(m *Manager, ctx context.Context, l *Lock, ttlMs string) (int64, error) {
	return extendBy(k, m, ctx, l, ttlMs)
}
