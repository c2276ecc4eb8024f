-- The read-write lock's state, shared by the rw_*.lua scripts: scripts.go
-- puts this file in place of the include line in each of them.
-- #include prelude.lua
-- #include fence.lua (next_fence)
-- #include announce.lua
--
-- A read-write lock is one hash at the lock key and nothing else, so that
-- a slot migration moves it whole and a script never writes a key that may
-- still be on the other node (the target of a migration refuses a key it
-- already has). Its fields:
--   sl      "rw1": a hash without it is not shardlock's and is never written
--   w, we   the writer's token and its expiry, while a writer holds it
--   r:<tok> each reader's expiry; n counts these fields
--   q       the waiters' queue: entries "<deadline ms>:<ttl ms>:<kind>:<token>"
--           one per line, kind "r" for a reader, "1" or "0" for a writer
--           with or without a fence
--   wq      the latest deadline of a writer queued, wp how long a writer
--           that polls asked new readers to wait: while either is in the
--           future new readers wait too, so readers cannot starve a writer
--   f       the last fence handed out
-- Expiries and deadlines are the server's clock in milliseconds; a share
-- whose expiry has passed counts as gone. The key lives as long as the
-- latest of them. When the lock falls free, the first live queued entry
-- gets it on the claim lease (RW_CLAIM), a reader together with the readers
-- queued right behind it, each announced on its owner's hand-over channel
-- (announce.lua).

local RW_MAGIC = 'rw1'
local RW_CLAIM = 200 -- scripts.ClaimLease, as claim_ms in handover.lua
local RW_RUN = 256 -- readers handed the lock by one release at most
local RW_QMAX = 4096 -- entries in a queue at most

local rw_now
-- now is the server's clock in milliseconds, read once per script.
local function now()
  if not rw_now then
    local t = redis.call('TIME')
    rw_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return rw_now
end

-- rw_load reads k: nil when k is not a read-write lock of shardlock's (a
-- key of another type, another hash), else its state (exists false for no
-- key). Only the fields every script needs are read.
local function rw_load(k)
  local v = redis.pcall('HMGET', k, 'sl', 'w', 'we', 'wq', 'wp', 'n', 'q')
  if type(v) ~= 'table' or v.err then return nil end
  if v[1] ~= RW_MAGIC then
    if redis.call('EXISTS', k) == 1 then return nil end
    return {exists = false, we = 0, wq = 0, wp = 0, n = 0}
  end
  local s = {exists = true, ttl = true, w = v[2], we = tonumber(v[3]) or 0, wq = tonumber(v[4]) or 0,
    wp = tonumber(v[5]) or 0, n = tonumber(v[6]) or 0, q = v[7]}
  if s.w and s.we <= now() then s.w = nil end -- the writer's time ran out
  return s
end

-- rw_keep makes k live until at least ms (server clock). A key that has an
-- expiry (every read-write lock does, once made) keeps a later one (GT).
local function rw_keep(k, s, ms)
  if s.ttl then
    redis.call('PEXPIREAT', k, ms, 'GT')
  else
    redis.call('PEXPIREAT', k, ms)
    s.ttl = true
  end
end

-- rw_writer_waits reports whether new readers must wait for a writer.
local function rw_writer_waits(s)
  return s.wq > now() or s.wp > now()
end

-- rw_entry parses a queue entry: its deadline, TTL, kind ('r', '0' or
-- '1') and token; nothing for junk.
local function rw_entry(e)
  local _, _, d, ttl, f, tok = string.find(e, '^(%d+):(%d+):([01r]):(sl1%.%d+%.[%w_-]+%..+)$')
  d, ttl = tonumber(d), tonumber(ttl)
  if not tok or not ttl or ttl < 1 or ttl > 86400000 then return nil end
  return d, ttl, f, tok
end

-- rw_queue returns the live entries of s's queue, in order.
local function rw_queue(s)
  local out = {}
  if not s.q then return out end
  for e in string.gmatch(s.q, '[^\n]+') do
    local d = rw_entry(e)
    if d and d >= now() then out[#out + 1] = e end
  end
  return out
end

-- rw_store writes queue list qs back to k (and s), with wq and the key's
-- life to match.
local function rw_store(k, s, qs)
  local wq, latest = 0, 0
  for _, e in ipairs(qs) do
    local d, _, f = rw_entry(e)
    if d > latest then latest = d end
    if f ~= 'r' and d > wq then wq = d end
  end
  if #qs == 0 then
    redis.call('HDEL', k, 'q', 'wq')
    s.q, s.wq = nil, 0
    return
  end
  s.q, s.wq = table.concat(qs, '\n'), wq
  redis.call('HSET', k, 'q', s.q)
  if wq > 0 then redis.call('HSET', k, 'wq', wq) else redis.call('HDEL', k, 'wq') end
  rw_keep(k, s, latest)
end

-- rw_live_readers counts k's readers whose time has not run out, deleting
-- the others' fields, and returns the count and their latest expiry. It
-- reads every reader's field only when some may have run out.
local function rw_live_readers(k, s)
  if s.n == 0 then return 0, 0 end
  local all = redis.call('HGETALL', k)
  local n, dead, latest = 0, 0, 0
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'r:' then
      local exp = tonumber(all[i + 1]) or 0
      if exp > now() then
        n = n + 1
        if exp > latest then latest = exp end
      else
        redis.call('HDEL', k, all[i])
        dead = dead + 1
      end
    end
  end
  if dead > 0 or n ~= s.n then
    s.n = n
    redis.call('HSET', k, 'n', n)
  end
  return n, latest
end

-- rw_fence takes k's next fence by fence.lua's rule (next_fence), from
-- the last one kept in the hash; the clock part keeps fences rising when
-- the key has gone meanwhile.
local function rw_fence(k)
  local f = next_fence(tonumber(redis.call('HGET', k, 'f')) or 0)
  redis.call('HSET', k, 'f', string.format('%d', f))
  return f
end

-- rw_set_writer makes tok k's writer for ttl ms, with a fence when fenced
-- (0 without); a writer that polled no longer holds readers back.
local function rw_set_writer(k, s, tok, ttl, fenced)
  local fence = 0
  if fenced then fence = rw_fence(k) end
  redis.call('HSET', k, 'sl', RW_MAGIC, 'w', tok, 'we', now() + ttl)
  redis.call('HDEL', k, 'wp')
  s.w, s.we, s.wp, s.exists = tok, now() + ttl, 0, true
  rw_keep(k, s, now() + ttl)
  return fence
end

-- rw_add_reader makes tok a reader of k for ttl ms (a reader already
-- there gets the new expiry). fresh says tok is known to have no share yet
-- (the common case, in one HSET).
local function rw_add_reader(k, s, tok, ttl, fresh)
  local exp = now() + ttl
  if not s.exists then
    s.n, s.exists = 1, true
    redis.call('HSET', k, 'sl', RW_MAGIC, 'r:' .. tok, exp, 'n', 1)
  elseif fresh then
    s.n = s.n + 1
    redis.call('HSET', k, 'r:' .. tok, exp, 'n', s.n)
  elseif redis.call('HSET', k, 'r:' .. tok, exp) == 1 then
    s.n = s.n + 1
    redis.call('HSET', k, 'n', s.n)
  end
  rw_keep(k, s, exp)
end

-- rw_first_tokens are the tokens of the first two entries of queue list qs.
local function rw_first_tokens(qs)
  local out = {}
  for i = 1, math.min(2, #qs) do
    local _, _, _, tok = rw_entry(qs[i])
    if tok then out[#out + 1] = tok end
  end
  return out
end

-- rw_hand_over gives k, which has no holder now, to the first live entry
-- of its queue: a writer, or a reader and the readers queued right behind
-- it, each on the claim lease; dead entries and junk are dropped. Each is
-- announced on its owner's channel, and the last of them to the entries
-- that are first and second in the queue then (announce.lua). It returns true when
-- it handed k over.
local function rw_hand_over(k, s)
  if not s.q then return false end
  local qs = rw_queue(s)
  local i, readers, last = 1, 0, nil
  while i <= #qs do
    local _, ttl, f, tok = rw_entry(qs[i])
    local lease = math.min(ttl, RW_CLAIM)
    if f ~= 'r' then
      if readers == 0 then
        table.remove(qs, i)
        local fence = rw_set_writer(k, s, tok, lease, f == '1')
        rw_store(k, s, qs)
        announce(k, tok, fence, rw_first_tokens(qs))
        return true
      end
      break -- the writer's turn comes after these readers
    end
    table.remove(qs, i)
    rw_add_reader(k, s, tok, lease, false)
    if last then announce(k, last, 0) end
    last = tok
    readers = readers + 1
    if readers >= RW_RUN then break end
  end
  rw_store(k, s, qs)
  if last then announce(k, last, 0, rw_first_tokens(qs)) end
  return readers > 0
end

-- rw_enqueue appends entry e to k's queue unless it is there already
-- (a re-check). It returns false for junk or a full queue.
local function rw_enqueue(k, s, e)
  local d = rw_entry(e)
  if not d or string.find(e, '\n', 1, true) then return false end
  local qs = rw_queue(s)
  for _, x in ipairs(qs) do
    if x == e then return true end
  end
  if #qs >= RW_QMAX then return false end
  qs[#qs + 1] = e
  rw_store(k, s, qs)
  return true
end

-- rw_dequeue takes entry e out of k's queue, and reports whether it was there.
local function rw_dequeue(k, s, e)
  if not s.q or not string.find(s.q, e, 1, true) then return false end
  local qs, found = {}, false
  for _, x in ipairs(rw_queue(s)) do
    if x == e and not found then found = true else qs[#qs + 1] = x end
  end
  rw_store(k, s, qs)
  return found
end
