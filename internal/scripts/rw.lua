-- The read-write lock's state, shared by the rw_*.lua scripts: scripts.go
-- puts this file in place of the include line in each of them.
-- #include prelude.lua
-- #include fence.lua
--
-- A read-write lock is one hash at the lock key, so that a slot migration
-- moves all of it at once: field "sl" is "rw1" (a hash without it is not
-- shardlock's and is never written), "w" the writer's token while a writer
-- holds it (the key's TTL is then the writer's), "r:<token>" each reader's
-- expiry (server clock, ms; the key lives until the latest one), and "wq"
-- the latest deadline of a writer waiting for it: while that is in the
-- future, new readers queue instead of joining, so a stream of readers
-- cannot starve a writer.
--
-- Waiters queue on "<key>:waiters" as the exclusive lock's do (see
-- handover.lua), a reader's entry with "r" in place of the fencing flag:
-- "<deadline ms>:<ttl ms>:<0|1|r>:<token>". When the lock falls free the
-- first live entry gets it on the claim lease (claim_ms), a reader together
-- with the readers queued right behind it, each announced on
-- "<key>:released" as "<sha1 of the token> <fence>". The queue and the
-- fence counter are helper keys, read through pcall as the exclusive
-- lock's are.

local RW_MAGIC = 'rw1'
local RW_CLAIM = 200 -- scripts.ClaimLease, as claim_ms in handover.lua
local RW_RUN = 256 -- readers handed the lock by one release at most
local RW_RESERVE = 1000 -- see rw_hand_over

local rw_now
-- now is the server's clock in milliseconds, read once per script.
local function now()
  if not rw_now then
    local t = redis.call('TIME')
    rw_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return rw_now
end

-- rw_kind tells what key k is: 'free' (no key), 'rw' (a read-write lock),
-- or 'foreign' (anything else: another type, a hash that is not ours).
local function rw_kind(k)
  local s = redis.pcall('HGET', k, 'sl')
  if s == RW_MAGIC then return 'rw' end
  if s == false and redis.call('EXISTS', k) == 0 then return 'free' end
  return 'foreign'
end

-- rw_entry parses a queue entry: its deadline, TTL, kind ('r', '0' or
-- '1': a writer with or without a fence) and token; nothing for junk.
local function rw_entry(e)
  local _, _, d, ttl, f, tok = string.find(e, '^(%d+):(%d+):([01r]):(sl1%.%d+%.[%w_-]+%..+)$')
  d, ttl = tonumber(d), tonumber(ttl)
  if not tok or not ttl or ttl < 1 or ttl > 86400000 then return nil end
  return d, ttl, f, tok
end

-- rw_readers counts the live readers of k, deletes the fields of readers
-- whose time ran out, and returns the count and the latest expiry.
local function rw_readers(k)
  local all = redis.call('HGETALL', k)
  local n, latest = 0, 0
  for i = 1, #all, 2 do
    local f = all[i]
    if string.sub(f, 1, 2) == 'r:' then
      local exp = tonumber(all[i + 1]) or 0
      if exp > now() then
        n = n + 1
        if exp > latest then latest = exp end
      else
        redis.call('HDEL', k, f)
      end
    end
  end
  return n, latest
end

-- rw_writer_waiting reports whether a live writer entry is queued for k,
-- and sets "wq" to match (scanning at most the first 1024 entries).
local function rw_writer_waiting(k)
  local q = redis.pcall('LRANGE', k .. QUEUE_SUFFIX, 0, 1023)
  local latest = 0
  if type(q) == 'table' and not q.err then
    for _, e in ipairs(q) do
      local d, _, f = rw_entry(e)
      if d and f ~= 'r' and d >= now() and d > latest then latest = d end
    end
  end
  if latest > 0 then
    redis.call('HSET', k, 'wq', latest)
    return true
  end
  redis.call('HDEL', k, 'wq')
  return false
end

-- rw_enqueue appends entry e to k's queue unless a re-check (recheck)
-- finds it there, keeping the queue until its latest entry's deadline, and
-- for a writer's entry raises "wq" to its deadline. It returns whether the
-- entry is queued.
local function rw_enqueue(k, e, recheck)
  local q = k .. QUEUE_SUFFIX
  if recheck and type(redis.pcall('LPOS', q, e)) == 'number' then return true end
  local d, _, f = rw_entry(e)
  if not d then return false end
  local n = redis.pcall('RPUSH', q, e)
  if type(n) ~= 'number' then return false end
  if n == 1 then
    redis.call('PEXPIREAT', q, d)
  else
    redis.call('PEXPIREAT', q, d, 'GT')
  end
  if f ~= 'r' and d > (tonumber(redis.call('HGET', k, 'wq')) or 0) then
    redis.call('HSET', k, 'wq', d)
  end
  return true
end

-- rw_set_writer makes token tok k's writer for ttl ms, taking a fence
-- first when fenced: it returns the fence (0 without), or nil and an error
-- reply with nothing written when no fence can be taken.
local function rw_set_writer(k, tok, ttl, fenced)
  local fence = 0
  if fenced then
    local err
    fence, err = take_fence(k .. FENCE_SUFFIX)
    if not fence then return nil, err end
  end
  local wq = redis.call('HGET', k, 'wq')
  redis.call('DEL', k)
  redis.call('HSET', k, 'sl', RW_MAGIC, 'w', tok)
  if wq then redis.call('HSET', k, 'wq', wq) end
  redis.call('PEXPIRE', k, ttl)
  return fence
end

-- rw_add_reader makes token tok a reader of k for ttl ms and keeps the key
-- until its latest reader's expiry.
local function rw_add_reader(k, tok, ttl)
  redis.call('HSET', k, 'sl', RW_MAGIC, 'r:' .. tok, now() + ttl)
  if redis.call('PTTL', k) < ttl then redis.call('PEXPIRE', k, ttl) end
end

-- rw_announce tells the waiter with token tok that it holds the lock.
local function rw_announce(k, tok, fence)
  redis.pcall('SPUBLISH', k .. CHANNEL_SUFFIX, redis.sha1hex(tok) .. ' ' .. string.format('%d', fence))
end

-- rw_hand_over gives k, which has no holder now, to the first live entry
-- of its queue: a writer, or a reader and the readers queued right behind
-- it, each on the claim lease; entries past their deadline and junk are
-- dropped. It returns true when it handed k over; k is deleted otherwise
-- (or kept for a waiting writer: see the end).
local function rw_hand_over(k)
  local q = k .. QUEUE_SUFFIX
  local readers, longest = 0, 0
  for _ = 1, RW_RUN + 64 do
    local e = redis.pcall('LINDEX', q, 0)
    if type(e) ~= 'string' then break end
    local d, ttl, f, tok = rw_entry(e)
    if d and d >= now() then
      if f ~= 'r' then
        if readers > 0 then break end -- the writer's turn comes after these readers
        redis.call('LPOP', q)
        local fence = rw_set_writer(k, tok, math.min(ttl, RW_CLAIM), f == '1')
        if not fence then
          redis.call('LPUSH', q, e) -- no fence here now: the writer re-checks
          break
        end
        rw_writer_waiting(k)
        rw_announce(k, tok, fence)
        return true
      end
      redis.call('LPOP', q)
      if readers == 0 then redis.call('HDEL', k, 'w') end
      local lease = math.min(ttl, RW_CLAIM)
      if lease > longest then longest = lease end
      redis.call('HSET', k, 'r:' .. tok, now() + lease)
      rw_announce(k, tok, 0)
      readers = readers + 1
      if readers >= RW_RUN then break end
    else
      redis.call('LPOP', q)
    end
  end
  if readers > 0 then
    redis.call('PEXPIRE', k, longest) -- the key lives as long as its readers
    rw_writer_waiting(k)
    return true
  end
  local wq = tonumber(redis.call('HGET', k, 'wq')) or 0
  if wq > now() then
    -- A writer waits that this node could not hand the lock to (it polls,
    -- or its queue is not here while the slot migrates): the key stays,
    -- held by nobody, so that new readers keep waiting, for RW_RESERVE ms
    -- at most, while the writer comes to take it.
    redis.call('PEXPIRE', k, math.min(wq - now(), RW_RESERVE))
    return false
  end
  redis.call('DEL', k)
  return false
end
