// Package manager is shardlock's lock engine: distributed locks on Redis
// (standalone, Sentinel-managed or Cluster) through go-redis.
//
// A [Manager] hands out [Lock] values:
//
//	m, err := manager.New(ctx, client)          // *redis.Client or *redis.ClusterClient
//	lock, err := m.Acquire(ctx, "order:123") // waits, with jittered backoff
//	defer lock.Release(ctx)
//	doWork(lock.Context())                   // cancelled if the lock is lost
//
// or, in one call, [Manager.Do].
//
// # Keys and tokens
//
// The lock on "order:123" is the key "shardlock:{order:123}" (see package
// sharding): its hash tag keeps every helper key of the lock in its slot. Its
// value is a token, "sl1.<unix-ms>.<128 random bits>.<owner>" (see
// [ParseToken]); whoever knows a token can release the lock, so shardlock
// never logs one whole and never uses one as a metric label.
//
// # Acquire, release, extend
//
// An acquire attempt is one SET key token NX PX ttl. A nil reply may be a
// re-sent attempt that ran (go-redis re-sends on a read timeout), so it is
// followed by a GET (later polls send SET ... GET), and a re-sent attempt
// finds its own token and holds the lock instead of reporting contention.
// With fencing it is one Lua script that also takes the next fence from a
// counter in the lock's slot. A waiting Acquire then queues up, in its process and in Redis, and
// the release before it hands it the lock (see [WithNotifications]): a fair
// queue, with no herd of retries. An attempt whose reply never
// came may still run on the server later; its token is released in the
// background until its TTL would have ended, so a timeout never strands a
// key. Release is a Lua compare-and-delete and Extend a compare-and-pexpire;
// both say why they did not act ([ErrNotHeld], [ErrExpired]) and retry
// transient errors (failover, TRYAGAIN, CLUSTERDOWN, timeouts) within the
// caller's context.
//
// # The watchdog
//
// Each Manager runs one goroutine, the watchdog scheduler. It renews every
// held lock every TTL/3, pipelining the renewals due in one tick per cluster
// node (10,000 held locks cost one round trip per master per tick), on a
// goroutine of their own so that a renewal stuck in I/O never delays a
// loss; a failed renewal is retried with backoff while the lock is valid.
// When a
// renewal finds the key gone or owned by someone else, or the lock's
// validity (measured on this process's monotonic clock from the send time of
// the last successful write) runs out with no successful renewal, the lock
// is lost: Done closes, Context is cancelled and Err matches [ErrLockLost].
// With a max hold, renewal stops at that age and Context is cancelled with
// [ErrMaxHoldExceeded]; the key then expires on its TTL unless released.
// Close stops the watchdog and releases what the Manager still holds.
//
// # Fencing
//
// A lock is a lease: a holder paused longer than its TTL (GC, a stalled VM)
// can resume believing it still holds the lock. No lock service can rule
// that out. With fencing ([WithFencing]),
// [Lock.Fence] is a number that rises with every acquisition of a resource;
// the protected storage must reject a write whose fence is lower than one it
// has seen. A fence is the larger of its counter plus one and the master's
// clock in microseconds, so it keeps rising across an unplanned failover
// that loses the counter's latest writes (Redis replicates asynchronously),
// as long as the old and the new master's clocks agree to within the time
// the failover took.
//
// # Read-write locks
//
// [Manager.AcquireRead] and [Manager.AcquireWrite] (and their Try forms)
// take a read-write lock: any number of readers or one writer. A waiting
// writer makes new readers wait behind it; waiters queue and are handed the
// lock as an exclusive lock's are; each reader's share has its own TTL,
// renewed by the watchdog; writers take fences. The whole lock is one hash
// at the lock key, so a slot migration moves it whole.
//
// # Deadlines and misbehaving servers
//
// Every call returns by its context's deadline, whatever the client's
// options: the Manager's coalescer (on by default, see [WithCoalescing])
// batches concurrent callers' commands per server and waits for each reply
// only until its caller's deadline, or at most 2 ms after its caller's
// context is cancelled; with coalescing off a command runs
// on the caller's goroutine where the client bounds it by the context
// (ContextTimeoutEnabled), else on a goroutine of the Manager's. No command
// is sent twice: go-redis's retries are off for shardlock's commands, and
// only a reply that says a command did not run (a redirect, TRYAGAIN,
// LOADING and the like) sends it again. A release that reaches Redis twice
// all the same answers the same both times. An attempt
// whose reply comes after its caller has gone is released. A context that
// has already ended sends nothing. Values shardlock did not write (another
// value or type under a lock key, a junk fence counter or queue entry) are
// never changed: such a key is someone else's.
//
// # Errors
//
// Sentinels ([ErrNotAcquired], [ErrNotHeld], [ErrExpired], [ErrLockLost],
// [ErrMaxHoldExceeded], [ErrClosed], ...) are matched with errors.Is; bad
// input is an [*InvalidArgumentError], reported before any round trip.
// "No longer held" is one family: errors.Is(err, ErrLockLost) matches
// ErrNotHeld, ErrExpired and the error of any lock known lost, and each
// still matches its own reason.
package manager
