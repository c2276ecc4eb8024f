package manager

import (
	"context"

	"github.com/shardlock/shardlock/internal/scripts"
)

// Read-write locks.
//
// A read-write lock on a resource is held by any number of readers or by
// one writer. It lives in one hash at the resource's lock key, with its
// queue and last fence (the layout is in internal/scripts/rw.lua and
// docs/design.md), and no other key, so a slot migration moves it whole.
// A resource is locked either with Acquire and its kin or as a read-write
// lock, not both: each sees the other's key as held by someone else.
//
// Each reader holds its own share, with its own TTL that the watchdog
// renews; a reader that dies frees its share when its TTL runs out, whoever
// else reads. A writer waiting for the lock stops new readers from
// joining: they queue behind it, so a stream of readers cannot starve it.
// Waiters queue in the fair queue and are handed the lock as an exclusive
// lock's are; a writer's release hands it to the first queued writer, or to
// the first queued reader together with the readers queued right behind
// it.
//
// The Lock returned works as any other: Release, Extend, TTL, Done and
// Context, the watchdog, Forget. Writers take fences when fencing is on
// (WithFencing); readers take none and their Fence is 0. Inspect and List
// report a read-write lock's readers and writer; Resume and ForceRelease
// take exclusive locks only (a read-write lock's key is left alone).

// AcquireRead takes a reader's share of the read-write lock on resource,
// waiting while a writer holds it or waits for it, as Acquire waits. Its
// errors are Acquire's.
func (m *Manager) AcquireRead(ctx context.Context, resource string, opts ...AcquireOption) (*Lock, error) {
	return m.acquire(ctx, resource, opts, rwRead, true)
}

// TryAcquireRead makes one attempt at a reader's share of the read-write
// lock on resource: it returns ErrNotAcquired when a writer holds the lock
// or waits for it. Its other errors are TryAcquire's.
func (m *Manager) TryAcquireRead(ctx context.Context, resource string, opts ...AcquireOption) (*Lock, error) {
	return m.acquire(ctx, resource, opts, rwRead, false)
}

// AcquireWrite takes the read-write lock on resource as its writer,
// waiting while readers or another writer hold it, as Acquire waits. Its
// errors are Acquire's.
func (m *Manager) AcquireWrite(ctx context.Context, resource string, opts ...AcquireOption) (*Lock, error) {
	return m.acquire(ctx, resource, opts, rwWrite, true)
}

// TryAcquireWrite makes one attempt to take the read-write lock on
// resource as its writer: it returns ErrNotAcquired while readers or
// another writer hold it. Its other errors are TryAcquire's.
func (m *Manager) TryAcquireWrite(ctx context.Context, resource string, opts ...AcquireOption) (*Lock, error) {
	return m.acquire(ctx, resource, opts, rwWrite, false)
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
	args := []any{a.token, a.ac.ttlMs, a.tg.rw.arg(), luaFlag(a.ac.fencing), entry, luaFlag(recheck), hold}
	var res []any
	if m.cfg.replicas > 0 {
		node, err := m.topo.masterFor(ctx, a.tg.key)
		if err != nil {
			return 0, 0, 0, err
		}
		pipe := node.Pipeline()
		cmd := scripts.RWAcquire.Eval(ctx, pipe, keys, args...)
		waitc := pipe.Do(ctx, "wait", m.cfg.replicas, m.cfg.replicaTimeout.Milliseconds())
		_, _ = pipe.Exec(ctx)
		res, err = cmd.Slice()
		status, fence, err = parseFenced(res, err)
		if err == nil && status != attemptContended {
			replicas = m.replicaCount(waitc, "acquire")
		}
	} else {
		res, err = scripts.RWAcquire.Run(ctx, m.cmd, keys, args...).Slice()
		status, fence, err = parseFenced(res, err)
	}
	if a.fw != nil {
		m.queues.afterQueuedAttempt(a.fw, entry, recheck, status, fence, err)
	}
	if status == attemptContended {
		fence = 0
	}
	return status, fence, replicas, err
}
