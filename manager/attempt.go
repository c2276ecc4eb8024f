package manager

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/shardlock/shardlock/internal/scripts"
	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/sharding"
)

// One acquire attempt, of every kind of lock: a single lock's (SET NX, the
// fenced script, or under WithReplicaAck a pipeline with WAIT), a fair
// waiter's (acquire_queue.lua, in fair.go), a batch's (acquire_batch.lua)
// and a read-write lock's (rw_acquire.lua). The primitives (batch.go,
// rwlock.go, ...) build on these; nothing here calls up into them.

// attemptResult is what one acquire attempt learned.
type attemptResult struct {
	status   int // attemptContended, attemptFresh or attemptReplay
	replicas int
	fence    uint64
	fences   []uint64 // a batch's
	held     []int    // a contended batch's: indices of the keys others hold (1-based)
	claimed  bool     // handed over on the claim lease (see fair.go)
	// validUntil: a lock handed over in this process (transfer) keeps the
	// validity of the lock that released it; zero otherwise.
	validUntil mono
}

// attemptArgs is one acquire attempt: a fair waiter's (fw set), a single
// lock's or a batch's.
type attemptArgs struct {
	tg                  target
	token               string
	tokenArg            any
	ac                  *acquireConfig
	fw                  *fairWaiter
	sendAt              time.Time
	firstTry, queueNext bool          // single lock: see attempt
	first, mark         bool          // batch: see attemptBatch
	hold                time.Duration // a polling writer's of a read-write lock: see attemptRW
}

// send makes one acquire attempt, bounded by ctx and deadline (see
// bounded). An attempt whose caller stopped waiting is settled when its
// reply comes: a token that may hold the keys goes to the reaper at once.
func (m *Manager) send(ctx context.Context, deadline time.Time, a attemptArgs) (attemptResult, error) {
	if err := ctx.Err(); err != nil {
		return attemptResult{}, err
	}
	bounds := m.tr.CmdBounds()
	if m.cfg.replicas > 0 {
		bounds = m.tr.ClientBounds() // the write and its WAIT go through the client
	}
	if cctx, cancel := transport.OnCaller(ctx, deadline, bounds); cctx != nil {
		defer cancel()
		return m.attemptSettled(cctx, &a)
	}
	b := a // captured by the exchange's goroutine; a stays on the stack
	return transport.ExchangeOn(m.tr, bounds, ctx, deadline, func(ctx context.Context) (attemptResult, error) {
		return m.attemptSettled(ctx, &b)
	}, func(res attemptResult, err error) {
		// The caller has gone: whatever the attempt may hold is released,
		// unless Redis said the key is someone else's or attemptSettled
		// already handed it over.
		if (err == nil && res.status != attemptContended) || (err != nil && !transport.IsAbandoned(err)) {
			m.orphan(b.tg, b.token, b.sendAt.Add(b.ac.ttl))
		}
	})
}

// attemptSettled is attemptOnce that hands the token to the reaper when the
// attempt was sent but its reply did not come in time (the coalescer's
// abandoned call): the server may still run it and take the key.
func (m *Manager) attemptSettled(ctx context.Context, a *attemptArgs) (attemptResult, error) {
	res, err := m.attemptOnce(ctx, a)
	if transport.IsAbandoned(err) {
		m.orphan(a.tg, a.token, a.sendAt.Add(a.ac.ttl))
	}
	return res, err
}

// attemptOnce makes the attempt a describes.
func (m *Manager) attemptOnce(ctx context.Context, a *attemptArgs) (res attemptResult, err error) {
	switch {
	case a.tg.rw != rwNone:
		res.status, res.fence, res.replicas, err = m.attemptRW(ctx, a)
	case a.fw != nil:
		res.status, res.fence, err = m.attemptQueued(ctx, a.tg.key, a.fw, a.ac)
	case a.tg.batch == nil:
		res.status, res.fence, res.replicas, err = m.attempt(ctx, a.tg.key, a.token, a.tokenArg, a.ac, a.firstTry, a.queueNext)
	default:
		res.status, res.fences, res.held, res.replicas, err = m.attemptBatch(ctx, a.tg.batch, a.tokenArg, a.ac, a.first, a.mark)
	}
	return res, err
}

// attempt makes one acquire attempt: one round trip, or two for a contended
// first try that must tell a replay apart.
//
// A first try (firstTry) sends SET NX PX, whose "OK" is the uncontended
// path's whole cost. A nil reply means another token holds the key, or
// ours does: go-redis re-sends a command whose reply was lost, so a SET
// that ran may answer nil. Unless the caller queues next (queueNext: the
// queue script tells a replay apart), a GET finds out. Later tries send
// SET NX PX GET, which answers both in one reply.
func (m *Manager) attempt(ctx context.Context, key, token string, tokenArg any, ac *acquireConfig, firstTry, queueNext bool) (status int, fence uint64, replicas int, err error) {
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

// parseGet reads the GET after a SET NX that answered nil: our token (with
// or without the queued mark) means the SET ran after all.
func parseGet(cmd *redis.StringCmd, token string) (int, error) {
	v, err := cmd.Result()
	switch {
	case errors.Is(err, redis.Nil):
		return attemptContended, nil // gone since: not ours
	case transport.IsWrongType(err):
		return attemptContended, nil // a key of another type: someone else's
	case err != nil:
		return 0, err
	case isOurs(v, token):
		return attemptReplay, nil
	}
	return attemptContended, nil
}

// isOurs reports whether a lock key's value v is token, with or without
// sharding.QueuedMark.
func isOurs(v, token string) bool {
	return v == token || (len(v) == len(token)+1 && v[len(token):] == sharding.QueuedMark && v[:len(token)] == token)
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

// evalWithWait runs script on the master that serves key, followed by a
// WAIT for WithReplicaAck's replicas in the same pipeline, so that WAIT
// counts the replicas that have the script's write. It returns the
// script's reply and the WAIT, which replicaCount reads once the reply
// says the script wrote.
func (m *Manager) evalWithWait(ctx context.Context, key string, script *redis.Script, keys []string, args ...any) (reply, wait *redis.Cmd, err error) {
	node, err := m.tr.MasterFor(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	pipe := node.Pipeline()
	reply = script.Eval(ctx, pipe, keys, args...)
	wait = pipe.Do(ctx, "wait", m.cfg.replicas, m.cfg.replicaTimeout.Milliseconds())
	_, _ = pipe.Exec(ctx)
	return reply, wait, nil
}

// replicaCount reads the WAIT sent after a write that succeeded (an
// acquire or an extend, named by op). The one rule for a WAIT that fails
// (an error reply, a connection lost after the write's reply): it counts
// as no replica acknowledging, it is logged at WARN, and the replica policy
// decides, as for any count below WithReplicaAck's.
func (m *Manager) replicaCount(wait *redis.Cmd, op string) int {
	n, err := wait.Int64()
	if err != nil {
		m.log.Warn("WAIT failed after "+op+"; counted as no replica acknowledging",
			zap.String("event", "replica_ack_failed"), zap.Error(err))
		return 0
	}
	return int(n)
}

func parseSetNXGet(cmd *redis.StringCmd, token string) (int, error) {
	old, err := cmd.Result()
	switch {
	case errors.Is(err, redis.Nil):
		return attemptFresh, nil
	case transport.IsWrongType(err):
		return attemptContended, nil // a key of another type: someone else's, left alone
	case err != nil:
		return 0, err
	case isOurs(old, token):
		return attemptReplay, nil
	}
	return attemptContended, nil
}

func parseFenced(res []any, err error) (int, uint64, error) {
	if err != nil {
		return 0, 0, err
	}
	if len(res) != 2 {
		return 0, 0, fmt.Errorf("shardlock: unexpected acquire reply %v", res)
	}
	st, _ := res[0].(int64)
	f, _ := res[1].(int64)
	return int(st), uint64(f), nil
}

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

// attemptBatch makes one batch acquire round trip for token (boxed as a
// script argument); a waiter (mark) marks the keys others hold, so that
// their release announces them free.
func (m *Manager) attemptBatch(ctx context.Context, b *batchInfo, token any, ac *acquireConfig, first, mark bool) (status int, fences []uint64, held []int, replicas int, err error) {
	keys, fencing := batchScriptKeys(b, ac.fencing)
	// A first attempt tries the keys as free before it reads them (the
	// cheapest script when the batch is free); a poll of a batch seen busy
	// reads first.
	try, marks := luaArg(first), luaArg(mark)
	var res []any
	if m.cfg.replicas > 0 {
		acq, waitc, err := m.evalWithWait(ctx, b.keys[0], scripts.AcquireBatch, keys, token, ac.ttlMs, fencing, try, marks)
		if err != nil {
			return 0, nil, nil, 0, err
		}
		if res, err = acq.Slice(); err != nil {
			return 0, nil, nil, 0, err
		}
		if len(res) > 0 && res[0] != scripts.AcquireHeld {
			replicas = m.replicaCount(waitc, "acquire")
		}
	} else {
		actx := ctx
		if len(keys) > 1 {
			actx = transport.WithTryAgainFallback(ctx)
		}
		if res, err = scripts.AcquireBatch.Run(actx, m.cmd, keys, token, ac.ttlMs, fencing, try, marks).Slice(); transport.IsTryAgain(err) {
			status, fences, held, err = m.attemptBatchKeys(ctx, b, token, ac, first, mark)
			return status, fences, held, 0, err
		} else if err != nil {
			return 0, nil, nil, 0, err
		}
	}
	status, fences, held, err = parseBatchReply(res, ac.fencing)
	return status, fences, held, replicas, err
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

// parseBatchReply reads acquire_batch.lua's reply.
func parseBatchReply(res []any, fencing bool) (status int, fences []uint64, held []int, err error) {
	if len(res) == 0 {
		return 0, nil, nil, fmt.Errorf("shardlock: unexpected batch acquire reply %v", res)
	}
	st, _ := res[0].(int64)
	ints := make([]int64, 0, len(res)-1)
	for _, v := range res[1:] {
		n, _ := v.(int64)
		ints = append(ints, n)
	}
	if st == scripts.AcquireHeld {
		held = make([]int, len(ints))
		for i, n := range ints {
			held[i] = int(n)
		}
		return attemptContended, nil, held, nil
	}
	if fencing {
		fences = make([]uint64, len(ints))
		for i, n := range ints {
			fences[i] = uint64(n)
		}
	}
	return int(st), fences, nil, nil
}
