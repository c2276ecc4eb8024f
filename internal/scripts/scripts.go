// Package scripts holds shardlock's Lua scripts, embedded from .lua files
// and compiled once. Run them with Script.Run (EVALSHA with EVAL fallback);
// in pipelines, load them first (All) and retry NOSCRIPT with EVAL.
package scripts

import (
	_ "embed"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/sharding"
)

var (
	//go:embed acquire_fenced.lua
	acquireFencedSrc string
	//go:embed handover.lua
	handoverSrc string
	//go:embed fence.lua
	fenceSrc string
	//go:embed entry.lua
	entrySrc string
	//go:embed take_fence.lua
	takeFenceSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed hand_on.lua
	handOnSrc string
	//go:embed acquire_queue.lua
	acquireQueueSrc string
	//go:embed extend.lua
	extendSrc string
	//go:embed pttl.lua
	pttlSrc string
	//go:embed acquire_batch.lua
	acquireBatchSrc string
	//go:embed release_batch.lua
	releaseBatchSrc string
	//go:embed extend_batch.lua
	extendBatchSrc string
	//go:embed pttl_batch.lua
	pttlBatchSrc string
	//go:embed resume.lua
	resumeSrc string
	//go:embed force_release.lua
	forceReleaseSrc string
	//go:embed rw.lua
	rwSrc string
	//go:embed rw_acquire.lua
	rwAcquireSrc string
	//go:embed rw_release.lua
	rwReleaseSrc string
	//go:embed rw_extend.lua
	rwExtendSrc string
	//go:embed rw_pttl.lua
	rwPTTLSrc string
	//go:embed rw_leave.lua
	rwLeaveSrc string
)

// The scripts. Their contracts are in the .lua files; the shared pieces
// (the fair queue's hand-over, handover.lua, and the fence, fence.lua) go
// where a script says "-- #include handover.lua" or "-- #include fence.lua".
var (
	AcquireFenced = redis.NewScript(include(acquireFencedSrc))
	TakeFence     = redis.NewScript(include(takeFenceSrc))
	Release       = redis.NewScript(include(releaseSrc))
	HandOn        = redis.NewScript(include(handOnSrc))
	AcquireQueue  = redis.NewScript(include(acquireQueueSrc))
	Extend        = redis.NewScript(include(extendSrc))
	PTTL          = redis.NewScript(include(pttlSrc))
	AcquireBatch  = redis.NewScript(include(acquireBatchSrc))
	ReleaseBatch  = redis.NewScript(include(releaseBatchSrc))
	ExtendBatch   = redis.NewScript(include(extendBatchSrc))
	PTTLBatch     = redis.NewScript(include(pttlBatchSrc))
	Resume        = redis.NewScript(include(resumeSrc))
	ForceRelease  = redis.NewScript(include(forceReleaseSrc))

	// The read-write lock's (rw.lua has its layout).
	RWAcquire = redis.NewScript(include(rwAcquireSrc))
	RWRelease = redis.NewScript(include(rwReleaseSrc))
	RWExtend  = redis.NewScript(include(rwExtendSrc))
	RWPTTL    = redis.NewScript(include(rwPTTLSrc))
	RWLeave   = redis.NewScript(include(rwLeaveSrc))
)

// ClaimLease is how long a key handed to a waiter queued in Redis lives
// until the new holder confirms it (claim_ms in handover.lua): a waiter
// that died while queued stalls the lock for no longer than that.
const ClaimLease = 200 * time.Millisecond

// FenceTTL is how long a fence counter lives past the TTL of the lock it
// fences (fence.lua): long after its last use, and longer than any step
// back a server's clock could take, since the clock part of the fence
// rule takes over once the counter is gone.
const FenceTTL = time.Hour

// All lists every script, for preloading.
func All() []*redis.Script {
	return []*redis.Script{AcquireFenced, TakeFence, Release, HandOn, AcquireQueue, Extend, PTTL, AcquireBatch, ReleaseBatch, ExtendBatch, PTTLBatch, Resume, ForceRelease,
		RWAcquire, RWRelease, RWExtend, RWPTTL, RWLeave}
}

// includePrefix starts the line where a script takes a shared piece.
const includePrefix = "-- #include "

// namesSrc is the piece names.lua, made from sharding's constants: the
// suffixes of a lock's helper keys and channel (the scripts derive those
// names from the lock key; declared in KEYS instead, helper keys that do
// not exist would make Redis answer TRYAGAIN to every script on a held
// lock for as long as its slot migrates) and the queued mark.
var namesSrc = fmt.Sprintf(`local FENCE_SUFFIX, QUEUE_SUFFIX, CHANNEL_SUFFIX, FORCED_SUFFIX = %q, %q, %q, %q
local QUEUED_MARK = '\%d'
local FENCE_TTL_MS = %d
`, sharding.FenceSuffix, sharding.QueueSuffix, sharding.ChannelSuffix, sharding.ForcedSuffix, sharding.QueuedMark[0], FenceTTL.Milliseconds())

// preludeSrc is the piece prelude.lua: names.lua, and is_mine, the one test
// of whether a lock key's value is a token's, forced and put_record. A script's fast
// path that needs only the names includes names.lua before it and
// prelude.lua after it: the server makes a script's functions anew on
// every call, and a fast path that returns first never pays for them.
var preludeSrc = `-- #include names.lua
-- is_mine reports whether v, a lock key's value, is token tok, with or
-- without the queued mark.
local function is_mine(v, tok) return v == tok or v == tok .. QUEUED_MARK end
-- forced reports whether a forced release took key k from token tok: it
-- left "<tok>=<who>|<why>" on k's forced record.
local function forced(k, tok)
  local r = redis.pcall('GET', k .. FORCED_SUFFIX)
  return type(r) == 'string' and string.sub(r, 1, #tok + 1) == tok .. '='
end
-- put_record writes val on rk, a record key of lock key k (its outcome or
-- forced record), for ms milliseconds. A record that is not on this node
-- is only created where the slot is stable: the target of a migrating slot
-- lets a script create any key of it, though the source may still have
-- the record, and a second copy would stop MIGRATE with BUSYKEY. There
-- (and on the source, which refuses keys it no longer has) Redis answers
-- TRYAGAIN to a command on two keys of which one is missing: then nothing
-- is written, and a re-sent release finds no record while the slot moves.
local function put_record(rk, k, val, ms)
  local r = redis.pcall('SET', rk, val, 'PX', ms, 'XX')
  if type(r) == 'table' and r.ok then return end
  if type(redis.pcall('EXISTS', k, rk)) == 'number' then
    redis.pcall('SET', rk, val, 'PX', ms)
  end
end
`

// announceSrc is the piece announce.lua: how a hand-over is announced, for
// handover.lua and rw.lua (scripts that hand nothing over do not make its
// functions).
var announceSrc = `-- #include names.lua
-- announce tells the waiter with token tok that it holds lock key k, as
-- "<sha1 of tok> <fence>" (tokens are not broadcast), on the hand-over
-- channel of tok's owner, "<k>:released:<owner>" (sharding.HandoverChannel),
-- and the same on the channels of the owners of nexts (the tokens of the
-- entries now first and second in k's queue; each owner once): a waiter that
-- hears a hand-over not its own looks again when the claim lease ends, so a
-- new holder that died while queued costs the next live waiter one lease,
-- even when the waiter right behind it died too. Nobody else hears it: a
-- hand-over sends at most three messages, however many processes wait.
local function owner_channel(k, tok)
  return k .. CHANNEL_SUFFIX .. ':' .. (string.match(tok, '^sl1%.%d+%.[%w_-]+%.(.+)$') or '')
end
local function announce(k, tok, fence, nexts)
  local msg = redis.sha1hex(tok) .. ' ' .. string.format('%d', fence)
  local ch = owner_channel(k, tok)
  local sent = {[ch] = true}
  redis.pcall('SPUBLISH', ch, msg)
  for _, nt in ipairs(nexts or {}) do
    local nch = owner_channel(k, nt)
    if not sent[nch] then
      sent[nch] = true
      redis.pcall('SPUBLISH', nch, msg)
    end
  end
end
`

// pieces are the shared pieces, by name.
var pieces = map[string]*string{"handover.lua": &handoverSrc, "fence.lua": &fenceSrc, "names.lua": &namesSrc, "prelude.lua": &preludeSrc, "rw.lua": &rwSrc, "announce.lua": &announceSrc, "entry.lua": &entrySrc}

// include puts each shared piece in place of the line of src that includes
// it (the rest of that line is a comment), and the pieces it includes in
// turn, each piece once. A line that names no piece is a bug: panic at
// init, caught by any test.
func include(src string) string {
	return includeOnce(src, map[string]bool{})
}

func includeOnce(src string, done map[string]bool) string {
	var b strings.Builder
	for line := range strings.Lines(src) {
		rest, ok := strings.CutPrefix(line, includePrefix)
		if !ok {
			b.WriteString(line)
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSpace(rest), " ")
		piece, ok := pieces[name]
		if !ok {
			panic("scripts: no piece " + name)
		}
		if !done[name] {
			done[name] = true
			b.WriteString(includeOnce(*piece, done))
		}
	}
	return b.String()
}
