-- Acquire a read-write lock (rw.lua, included below, has its layout) as a
-- reader or a writer, or queue up for it.
-- KEYS[1] lock key
-- ARGV[1] token, ARGV[2] TTL in milliseconds, ARGV[3] 'r' for a reader,
-- 'w' for a writer, ARGV[4] '1' for a writer to take a fence, ARGV[5] the
-- waiter's queue entry or '' (not queueing), ARGV[6] '1' when the entry
-- may be queued already (a re-check), ARGV[7] for a waiting writer that
-- polls (does not queue), how long (ms) new readers are to wait for it,
-- else '0'.
--
-- A reader joins when no writer holds the lock and none waits; a writer
-- takes it when nobody holds it. Returns {1, fence} when this call took the
-- lock (a re-check that did also takes its entry out of the queue), {2,
-- fence} when the token holds it already (a re-sent attempt, or a
-- hand-over whose announcement was missed or came late: its time is then
-- set to ARGV[2] from now, which confirms a claim), {0, ms} when it is held
-- otherwise: the entry is then queued (unless it is there already), and ms
-- is, on a re-check, how long until the holders in the way run out of
-- time (0: not known), else 0. A key that is not a read-write lock of
-- shardlock's is held by someone else and never written. fence is 0 for
-- readers.
-- #include rw.lua
local k, tok, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
local reader, fenced = ARGV[3] == 'r', ARGV[4] == '1'
local entry, recheck = ARGV[5], ARGV[6] == '1'
local s = rw_load(k)
if not s then return {0, 0} end

-- took answers {status, fence}, taking a re-check's entry out of the queue.
local function took(status, fence)
  if recheck then rw_dequeue(k, s, entry) end
  return {status, fence}
end

if s.w == tok then -- ours already
  redis.call('HSET', k, 'we', now() + ttl)
  rw_keep(k, s, now() + ttl)
  local f = 0
  if fenced then f = tonumber(redis.call('HGET', k, 'f')) or 0 end
  return took(2, f)
end
if reader and s.n > 0 and redis.call('HEXISTS', k, 'r:' .. tok) == 1 then
  rw_add_reader(k, s, tok, ttl, false)
  return took(2, 0)
end

local wait_ms = 0 -- until the holders in the way run out of time
if reader then
  if not s.w and not rw_writer_waits(s) then
    rw_add_reader(k, s, tok, ttl, true) -- no share: looked for above
    return took(1, 0)
  end
  if s.w then wait_ms = s.we - now() end
elseif not s.w then
  local n, latest = rw_live_readers(k, s)
  if n == 0 then
    return took(1, rw_set_writer(k, s, tok, ttl, fenced))
  end
  wait_ms = latest - now()
else
  wait_ms = s.we - now()
end

-- Held: queue up, or (a writer that polls) hold new readers back a while.
if entry ~= '' then
  rw_enqueue(k, s, entry)
elseif not reader and (tonumber(ARGV[7]) or 0) > 0 then
  local hold = now() + tonumber(ARGV[7])
  if hold > s.wp then
    redis.call('HSET', k, 'wp', hold)
    rw_keep(k, s, hold)
  end
end
if recheck then return {0, math.max(wait_ms, 0)} end
return {0, 0}
