package manager

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/keyscan"
	"github.com/shardlock/shardlock/internal/rwhash"
	"github.com/shardlock/shardlock/internal/transport"
	"github.com/shardlock/shardlock/sharding"
)

// LockInfo is what Inspect tells about a lock: who holds it and for how
// long, its fence, and its waiters. It never carries a token's secret part.
type LockInfo struct {
	Resource string
	Key      string
	// Held: the key exists. Foreign: it holds something that is not a
	// shardlock token (another value, another type); Owner and AcquiredAt
	// are then empty.
	Held, Foreign bool
	Owner         string    // the holder's owner id (WithOwner)
	AcquiredAt    time.Time // when the holder's acquire began
	TTL           time.Duration
	Fence         uint64 // the lock's fence counter: its latest fence (0: never fenced)
	Waiters       int    // waiters queued in Redis (the fair queue), one per waiting process
	// OldestWait is how long the first queued waiter has waited (0 with
	// none), by this process's clock against the time in its token.
	OldestWait time.Duration
	// ReadWrite: the key is a read-write lock (AcquireRead, AcquireWrite).
	// Owner and AcquiredAt are then its writer's, if a writer holds it;
	// Readers counts the readers whose shares have time left (a dead
	// reader's until its TTL runs out); Fence is its last writer's; TTL is
	// how long the key lives, which may be longer than any share.
	ReadWrite bool
	Readers   int
}

// readRW fills info from the fields of a hash (HGETALL), and reports
// whether they are a read-write lock's.
func (info *LockInfo) readRW(f map[string]string, now time.Time) bool {
	st, ok := rwhash.Parse(f, now)
	if !ok {
		return false
	}
	info.ReadWrite, info.Foreign = true, false
	info.Owner, info.AcquiredAt = "", time.Time{}
	if ti, err := ParseToken(st.Writer); err == nil {
		info.Owner, info.AcquiredAt = ti.Owner, ti.AcquiredAt
	}
	info.Readers, info.Fence = len(st.Readers), st.Fence
	info.Waiters, info.OldestWait = len(st.Queue), 0
	if len(st.Queue) > 0 {
		if _, _, _, tok, ok := cutEntry(st.Queue[0]); ok {
			if ti, err := ParseToken(tok); err == nil {
				info.OldestWait = max(now.Sub(ti.AcquiredAt), 0)
			}
		}
	}
	info.Held = st.Held()
	return true
}

// Inspect reads what an operator needs to know about resource's lock, in
// one pipeline on the master that serves it, and changes nothing. While
// the lock's slot migrates, each key is read where it is (a key the source
// no longer has, on the target). It returns an *InvalidArgumentError for a
// bad resource before any round trip.
func (m *Manager) Inspect(ctx context.Context, resource string) (LockInfo, error) {
	if err := m.open(); err != nil {
		return LockInfo{}, err
	}
	if ctx == nil {
		return LockInfo{}, invalid("context", "nil")
	}
	key, err := m.lockKey(resource)
	if err != nil {
		return LockInfo{}, err
	}
	return transport.Exchange(m.tr, ctx, time.Time{}, func(ctx context.Context) (LockInfo, error) {
		node, err := m.tr.MasterFor(ctx, key)
		if err != nil {
			return LockInfo{}, err
		}
		queue := sharding.QueueKey(key)
		pipe := node.Pipeline()
		val := pipe.Get(ctx, key)
		pttl := pipe.PTTL(ctx, key)
		exists := pipe.Exists(ctx, key)
		fence := pipe.Get(ctx, sharding.FenceKey(key))
		waiters := pipe.LLen(ctx, queue)
		first := pipe.LIndex(ctx, queue, 0)
		rw := pipe.HGetAll(ctx, key)
		_, _ = pipe.Exec(ctx) // each reply is read below; a key of another type answers its own error
		m.readRedirected(ctx, val, pttl, exists, fence, waiters, first, rw)
		if err := firstErr(exists, pttl); err != nil {
			return LockInfo{}, fmt.Errorf("shardlock: inspect %q: %w", resource, err)
		}
		info := LockInfo{Resource: resource, Key: key, Held: exists.Val() == 1}
		if d := pttl.Val(); d > 0 {
			info.TTL = d
		}
		if info.Held {
			if v, err := val.Result(); err != nil {
				info.Foreign = true // another type
			} else if ti, err := ParseToken(v); err != nil {
				info.Foreign = true
			} else {
				info.Owner, info.AcquiredAt = ti.Owner, ti.AcquiredAt
			}
		}
		info.Fence, _ = fence.Uint64() // absent or junk: 0
		if n, err := waiters.Result(); err == nil {
			info.Waiters = int(n)
		}
		if e, err := first.Result(); err == nil {
			if _, _, _, tok, ok := cutEntry(e); ok {
				if ti, err := ParseToken(tok); err == nil {
					info.OldestWait = max(time.Since(ti.AcquiredAt), 0)
				}
			}
		}
		if info.Foreign {
			info.readRW(rw.Val(), time.Now())
		}
		return info, nil
	}, nil)
}

// readRedirected sends again the reads among cmds that a node answered
// with a redirect: ASK (the slot migrates and the key is not on the
// source: read on the target, after ASKING) or MOVED (the slot has moved
// since the slot map was read: read on the node it names, and the map is
// reloaded). Reads only, so sending one twice changes nothing; a read
// redirected again keeps its redirect.
func (m *Manager) readRedirected(ctx context.Context, cmds ...redis.Cmder) {
	if m.tr.Cluster() == nil {
		return // one server: no redirects
	}
	var again []redis.Cmder
	var kind, addr string // of the first redirect: the others of one slot name the same
	for _, c := range cmds {
		if !transport.IsRedirect(c.Err()) {
			continue
		}
		// "ASK <slot> <addr>" or "MOVED <slot> <addr>"
		msg, _ := transport.ReplyMsg(c.Err())
		f := strings.Fields(msg)
		if len(f) != 3 || (addr != "" && (f[0] != kind || f[2] != addr)) {
			continue
		}
		kind, addr = f[0], f[2]
		again = append(again, c)
	}
	if len(again) == 0 {
		return
	}
	asking := kind == "ASK"
	if !asking {
		m.tr.Reload(ctx)
	}
	masters, err := m.tr.Masters(ctx)
	if err != nil {
		return
	}
	i := slices.IndexFunc(masters, func(n *redis.Client) bool { return n.Options().Addr == addr })
	if i < 0 {
		return
	}
	pipe := masters[i].Pipeline()
	for _, c := range again {
		if asking {
			pipe.Do(ctx, "asking")
		}
		c.SetErr(nil)
		_ = pipe.Process(ctx, c)
	}
	_, _ = pipe.Exec(ctx)
}

// firstErr returns the first error of cmds that is not a nil reply.
func firstErr(cmds ...redis.Cmder) error {
	for _, c := range cmds {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
	}
	return nil
}

// ListOptions selects the locks List reports.
type ListOptions struct {
	// Prefix keeps the resources that start with it ("" keeps all).
	Prefix string
	// Class keeps the locks of that metrics class, as the Manager names
	// it (WithClassFunc; by default metrics.ClassOf, the resource's
	// namespace); "" keeps all.
	Class string
	// Count is SCAN's COUNT hint per round trip (0: 1000).
	Count int64
}

// List walks every master (SCAN MATCH with a COUNT hint, then one pipeline
// of reads per batch, as the exporter scans) and yields a LockInfo for each
// lock held under this Manager's key prefix that opts selects, as it goes:
// memory stays bounded by a batch, whatever the keyspace holds. Helper keys
// are skipped; a key that holds something else than a token is yielded
// with Foreign set. The walk stops at the first error, which it yields, or
// when the loop breaks. A lock may be reported twice if the slot map
// changes during the walk, as SCAN allows.
func (m *Manager) List(ctx context.Context, opts ListOptions) iter.Seq2[LockInfo, error] {
	return func(yield func(LockInfo, error) bool) {
		if err := m.open(); err != nil {
			yield(LockInfo{}, err)
			return
		}
		if ctx == nil {
			yield(LockInfo{}, invalid("context", "nil"))
			return
		}
		count := cmp.Or(opts.Count, 1000)
		pattern := m.cfg.prefix + "*"
		masters, err := m.tr.Masters(ctx)
		if err != nil {
			yield(LockInfo{}, fmt.Errorf("shardlock: list: %w", err))
			return
		}
		stopped := false
		for _, node := range masters {
			err := keyscan.Walk(ctx, node, pattern, count, func(keys []string, _ bool) (bool, error) {
				infos, err := m.readLocks(ctx, node, keys, opts)
				if err != nil {
					return true, err
				}
				for _, info := range infos {
					if !yield(info, nil) {
						stopped = true
						return true, nil
					}
				}
				return false, nil
			})
			if stopped {
				return
			}
			if err != nil {
				yield(LockInfo{}, fmt.Errorf("shardlock: list: %w", err))
				return
			}
		}
	}
}

// readLocks reads, in one pipeline on node, the locks among keys that opts
// selects.
func (m *Manager) readLocks(ctx context.Context, node *redis.Client, keys []string, opts ListOptions) ([]LockInfo, error) {
	type read struct {
		info    LockInfo
		val     *redis.StringCmd
		pttl    *redis.DurationCmd
		fence   *redis.StringCmd
		waiters *redis.IntCmd
	}
	var reads []read
	pipe := node.Pipeline()
	for _, k := range keys {
		if sharding.IsHelperKey(k) || strings.HasSuffix(k, sharding.ChannelSuffix) {
			continue
		}
		r, ok := sharding.ResourceOf(m.cfg.prefix, k)
		if !ok || !strings.HasPrefix(r, opts.Prefix) || (opts.Class != "" && m.className(r) != opts.Class) {
			continue
		}
		reads = append(reads, read{info: LockInfo{Resource: r, Key: k},
			val: pipe.Get(ctx, k), pttl: pipe.PTTL(ctx, k), fence: pipe.Get(ctx, sharding.FenceKey(k)), waiters: pipe.LLen(ctx, sharding.QueueKey(k))})
	}
	if len(reads) == 0 {
		return nil, nil
	}
	_, _ = pipe.Exec(ctx) // each reply is read below: one odd key never fails the walk
	out := make([]LockInfo, 0, len(reads))
	var hashes []int // in out: keys of another type, maybe read-write locks
	for _, r := range reads {
		v, err := r.val.Result()
		switch {
		case errors.Is(err, redis.Nil):
			continue // released since the SCAN
		case transport.IsRedirect(err):
			continue // its slot left the node since the SCAN: listed where it is, if the walk is yet to get there
		case err != nil && !transport.IsReply(err):
			return nil, err // the connection failed
		case err != nil:
			r.info.Foreign = true // another type
			hashes = append(hashes, len(out))
		default:
			if ti, perr := ParseToken(v); perr == nil {
				r.info.Owner, r.info.AcquiredAt = ti.Owner, ti.AcquiredAt
			} else {
				r.info.Foreign = true
			}
		}
		r.info.Held = true
		if d := r.pttl.Val(); d > 0 {
			r.info.TTL = d
		}
		r.info.Fence, _ = r.fence.Uint64()
		r.info.Waiters = int(r.waiters.Val())
		out = append(out, r.info)
	}
	return readRWLocks(ctx, node, out, hashes)
}

// readRWLocks reads, in a second pipeline, the keys of out at indices
// hashes (keys of another type than a string): a read-write lock's fields
// fill its LockInfo, and one that nobody holds is left out.
func readRWLocks(ctx context.Context, node *redis.Client, out []LockInfo, hashes []int) ([]LockInfo, error) {
	if len(hashes) == 0 {
		return out, nil
	}
	pipe := node.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(hashes))
	for i, j := range hashes {
		cmds[i] = pipe.HGetAll(ctx, out[j].Key)
	}
	_, _ = pipe.Exec(ctx)
	drop := map[int]bool{}
	now := time.Now()
	for i, j := range hashes {
		if err := cmds[i].Err(); err != nil && !transport.IsReply(err) {
			return nil, err // the connection failed
		}
		if out[j].readRW(cmds[i].Val(), now) && !out[j].Held {
			drop[j] = true
		}
	}
	kept := out[:0]
	for j, info := range out {
		if !drop[j] {
			kept = append(kept, info)
		}
	}
	return kept, nil
}
