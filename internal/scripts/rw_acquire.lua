-- Acquire a read-write lock (rw.lua, included below, has its layout) as a
-- reader or a writer, or queue up for it.
-- KEYS[1] lock key
-- ARGV[1] token, ARGV[2] TTL in milliseconds, ARGV[3] 'r' for a reader,
-- 'w' for a writer, ARGV[4] '1' for a writer to take a fence, ARGV[5] the
-- waiter's queue entry or '' (not queueing), ARGV[6] '1' when the entry
-- may be queued already (a re-check), ARGV[7] for a waiting writer that
-- does not queue (it polls), how long (ms) new readers are to wait for it,
-- else '0'.
--
-- A reader joins when no writer holds the lock and none waits; a writer
-- takes it when nobody holds it (readers whose time ran out do not count).
-- Returns {1, fence} when this call took the lock (a re-check that did also
-- takes its entry out of the queue), {2, fence} when the token holds it
-- already (a re-sent attempt, or a hand-over whose announcement was missed
-- or came late; its time is then set to ARGV[2] from now, which confirms a
-- claim), {0, pttl} when it is held otherwise: the entry is then queued
-- (unless a re-check finds it there), and pttl is the key's remaining TTL
-- on a re-check, else 0. A key that is not a read-write lock of shardlock's
-- is held by someone else and never written. fence is 0 for readers.
-- #include rw.lua
local k, tok, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
local reader, fenced = ARGV[3] == 'r', ARGV[4] == '1'
local entry, recheck = ARGV[5], ARGV[6] == '1'
local kind = rw_kind(k)
if kind == 'foreign' then return {0, 0} end

local function took(fence)
  if recheck then redis.pcall('LREM', k .. QUEUE_SUFFIX, 1, entry) end
  return {1, fence}
end
local function fence_now()
  if not fenced then return 0 end
  local f = tonumber(redis.pcall('GET', k .. FENCE_SUFFIX))
  if not f then return redis.error_reply('ERR fence counter is not an integer') end
  return f
end

if kind == 'rw' then
  local w = redis.call('HGET', k, 'w')
  if w == tok then
    redis.call('PEXPIRE', k, ttl)
    local f = fence_now()
    if type(f) ~= 'number' then return f end
    return {2, f}
  end
  if reader and redis.call('HEXISTS', k, 'r:' .. tok) == 1 then
    rw_add_reader(k, tok, ttl)
    return {2, 0}
  end
  if not w then
    if reader then
      local wq = tonumber(redis.call('HGET', k, 'wq')) or 0
      if wq < now() or (recheck and not rw_writer_waiting(k)) then
        if wq > 0 and wq < now() then redis.call('HDEL', k, 'wq') end
        rw_add_reader(k, tok, ttl)
        return took(0)
      end
    elseif rw_readers(k) == 0 then
      local fence, err = rw_set_writer(k, tok, ttl, fenced)
      if not fence then return err end
      if recheck then redis.pcall('LREM', k .. QUEUE_SUFFIX, 1, entry) end
      rw_writer_waiting(k)
      return {1, fence}
    end
  end
elseif reader then
  rw_add_reader(k, tok, ttl)
  return took(0)
else
  local fence, err = rw_set_writer(k, tok, ttl, fenced)
  if not fence then return err end
  return took(fence)
end

-- Held: queue up, or (a polling writer) hold new readers back for a while.
if entry ~= '' then
  rw_enqueue(k, entry, recheck)
elseif not reader and tonumber(ARGV[7]) and tonumber(ARGV[7]) > 0 then
  local until_ms = now() + tonumber(ARGV[7])
  if until_ms > (tonumber(redis.call('HGET', k, 'wq')) or 0) then redis.call('HSET', k, 'wq', until_ms) end
end
if recheck then return {0, math.max(redis.call('PTTL', k), 0)} end
return {0, 0}
