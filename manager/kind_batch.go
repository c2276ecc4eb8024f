package manager

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
)

// kindBatch is the kind of a lock on several keys of one slot, taken and
// released together (acquire_batch.lua, release_batch.lua: see
// attempt_batch.go). A waiting batch does not queue: it marks the keys
// others hold and wakes when one of them is released.
var kindBatch lockKind = batchKind{}

type batchKind struct{}

func (batchKind) attempt(m *Manager, ctx context.Context, a attemptArgs) (res attemptResult, err error) {
	res.status, res.fences, res.held, res.replicas, err = m.attemptBatch(ctx, a.tg.batch, a.tokenArg, a.ac, a.first, a.mark)
	return res, err
}

func (batchKind) queues() bool                  { return false }
func (batchKind) fenced() bool                  { return true }
func (batchKind) holdsReaders() bool            { return false }
func (batchKind) handsOver() bool               { return false }
func (batchKind) queueMark(fencing bool) string { return luaFlag(fencing) }

// perKey is kindExclusive: a batch's key holds its token as an exclusive
// lock's does.
func (batchKind) perKey() lockKind { return kindExclusive }

// leave has nothing to do: a batch never queues.
func (batchKind) leave(*Manager, context.Context, string, string) (bool, error) { return true, nil }

func (batchKind) releaseCall(keys []string, token []any, _ string, _ bool) transport.ScriptCall {
	return transport.ScriptCall{Script: scripts.ReleaseBatch, Keys: keys, Args: token}
}

// releaseResult reads release_batch.lua's reply (1 when every key was
// deleted, else a code per key) as nil or a *BatchReleaseError naming the
// resources not released cleanly.
func (batchKind) releaseResult(l *Lock, cmd *redis.Cmd, ambiguous bool, sentAt, validUntil time.Time) (error, int64, uint64, error) {
	if v, err := cmd.Result(); err == nil && v == scripts.Done {
		return nil, 0, 0, nil
	}
	res, err := cmd.Int64Slice()
	if err != nil {
		return nil, 0, 0, err
	}
	var be *BatchReleaseError
	for i, r := range res {
		e := releaseResult(r, nil, ambiguous, sentAt, validUntil)
		if e == nil {
			continue
		}
		if be == nil {
			be = &BatchReleaseError{Results: map[string]error{}}
		}
		if i < len(l.batch.resources) {
			be.Results[l.batch.resources[i]] = e
		}
	}
	if be == nil {
		return nil, 0, 0, nil
	}
	return be, 0, 0, nil
}

func (batchKind) extendCall(keys []string, token any, ttlMs string) transport.ScriptCall {
	return transport.ScriptCall{Script: scripts.ExtendBatch, Keys: keys, Args: []any{token, ttlMs}}
}

func (batchKind) pttlCall(keys []string, token []any) transport.ScriptCall {
	return transport.ScriptCall{Script: scripts.PTTLBatch, Keys: keys, Args: token}
}

func (k batchKind) release(m *Manager, ctx context.Context, l *Lock, entry string, local, ambiguous bool, sentAt, validUntil time.Time) (error, int64, uint64, error) {
	return releaseBy(k, m, ctx, l, entry, local, ambiguous, sentAt, validUntil)
}

func (k batchKind) extend(m *Manager, ctx context.Context, l *Lock, ttlMs string) (int64, error) {
	return extendBy(k, m, ctx, l, ttlMs)
}
