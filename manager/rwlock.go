package manager

import (
	"context"
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
	return m.acquire(ctx, resource, opts, kindReader, true)
}

// TryAcquireRead makes one attempt at a reader's share of the read-write
// lock on resource: it returns ErrNotAcquired when a writer holds the lock
// or waits for it. Its other errors are TryAcquire's.
func (m *Manager) TryAcquireRead(ctx context.Context, resource string, opts ...AcquireOption) (*Lock, error) {
	return m.acquire(ctx, resource, opts, kindReader, false)
}

// AcquireWrite takes the read-write lock on resource as its writer,
// waiting while readers or another writer hold it, as Acquire waits. Its
// errors are Acquire's.
func (m *Manager) AcquireWrite(ctx context.Context, resource string, opts ...AcquireOption) (*Lock, error) {
	return m.acquire(ctx, resource, opts, kindWriter, true)
}

// TryAcquireWrite makes one attempt to take the read-write lock on
// resource as its writer: it returns ErrNotAcquired while readers or
// another writer hold it. Its other errors are TryAcquire's.
func (m *Manager) TryAcquireWrite(ctx context.Context, resource string, opts ...AcquireOption) (*Lock, error) {
	return m.acquire(ctx, resource, opts, kindWriter, false)
}
