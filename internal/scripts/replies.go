package scripts

// The scripts' replies, one convention for all of them. A script that acts
// on a held lock (release, extend, the TTL read, and their batch forms)
// answers a status per key: Done, Gone or NotOurs (a batch's release
// answers Done alone when every key was deleted); the release also answers
// HandedOver, or {HandedToNext, fence}; the TTL read answers {status, ms}.
const (
	// Done: the key held the token and the script did what it is for.
	Done int64 = 1
	// Gone: the key does not exist (it expired, or was deleted).
	Gone int64 = 0
	// NotOurs: another token, another value or a key of another type holds
	// the key; it was left alone.
	NotOurs int64 = -1
	// HandedOver (release): the key now holds the first live waiter queued
	// in Redis, on its claim lease, and that waiter was announced.
	HandedOver int64 = 2
	// HandedToNext (release, as {HandedToNext, fence}): the key now holds
	// the waiter whose entry the release carried (ARGV[2]).
	HandedToNext int64 = 3
	// Forced (release, extend, the TTL read): the token's lock was taken
	// away by a forced release, which left its record beside the key.
	Forced int64 = -2
)

// The acquire scripts' statuses (acquire_fenced.lua, acquire_queue.lua,
// acquire_batch.lua), the first element of their reply (an unfenced
// batch's fast path answers AcquireSet alone).
const (
	// AcquireHeld: another token, value or type holds the key (or one key
	// of a batch).
	AcquireHeld int64 = 0
	// AcquireSet: this call set the key (every key of a batch).
	AcquireSet int64 = 1
	// AcquireOurs: the key already held this token: a re-sent attempt, or
	// a hand-over to this waiter.
	AcquireOurs int64 = 2
)
