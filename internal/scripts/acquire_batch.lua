-- Acquire several keys of one slot, all or none.
-- KEYS[1..n] lock keys; with fencing, KEYS[n+1..2n] their fence counters.
-- ARGV[1] token, ARGV[2] TTL in milliseconds, ARGV[3] '1' to take fences,
-- ARGV[4] '1' to try the keys as free first (a first attempt; a poll of a
-- batch known to be busy reads first and writes nothing while it is busy),
-- ARGV[5] '1' for a waiter: the keys others hold get release.lua's queued
-- mark "\30" (TTL kept), so that their release announces them free.
-- Returns {0, i...} with the (1-based) indices of keys another token (or
-- another value, or a key of another type) holds;
-- else 1 when this call set the keys of an unfenced batch on the fast path
-- below (an integer: a table costs the server more to build and send),
-- {1, fence...} when this call set the keys, {2, fence...} when every
-- key already held this token (a re-sent attempt; a key may hold it with
-- release.lua's queued mark "\30"). Fences only with fencing.
-- Fast path, the free batch: one SET NX PX per key and nothing else (every
-- redis.call costs; this path is what a batch costs over a single lock).
-- It runs before the shared pieces are defined below: their functions are
-- made anew on every call, which costs the server more than this path's
-- bookkeeping. At the first key that is not free, undo the keys set so far
-- (they were free: nothing ran between) and decide on the slow path below.
local fencing = ARGV[3] == '1'
local n = #KEYS
if fencing then n = n / 2 end
local set_all = false
if ARGV[4] == '1' then
  local i = 1
  while i <= n and redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2], 'NX') do
    i = i + 1
  end
  if i > n then
    if not fencing then return 1 end
    set_all = true
  elseif i > 1 then
    redis.call('DEL', unpack(KEYS, 1, i - 1))
  end
end
-- #include prelude.lua
-- #include fence.lua
-- fences appends the keys' fences to out: taken (a fresh batch; see
-- fence.lua) or read (resent). A counter that is not an integer makes an
-- error reply; a fresh batch then first deletes the keys it set, so an
-- error leaves nothing behind.
local function fences(out, resent)
  if fencing then
    for i = 1, n do
      local f
      if resent then
        f = tonumber(redis.pcall('GET', KEYS[n + i]))
      else
        f = take_fence(KEYS[n + i], ARGV[2])
      end
      if type(f) ~= 'number' then
        if not resent then redis.call('DEL', unpack(KEYS, 1, n)) end
        return redis.error_reply('ERR fence counter ' .. KEYS[n + i] .. ' is not an integer')
      end
      out[#out + 1] = f
    end
  end
  return out
end
if set_all then
  return fences({1}, false)
end
local cur = redis.call('MGET', unpack(KEYS, 1, n))
local held, mine, vals = {}, 0, {}
for j = 1, n do
  local v = cur[j]
  if is_mine(v, ARGV[1]) then
    mine = mine + 1
    vals[j] = v -- kept as it is: the queued mark of release.lua stays
  elseif v or redis.call('EXISTS', KEYS[j]) == 1 then
    held[#held + 1] = j -- another token, another value, or a key of another type (MGET reads it as nil)
  end
end
if #held > 0 then
  if ARGV[5] == '1' then
    for _, j in ipairs(held) do
      local v = cur[j]
      -- Only a shardlock token gets the mark: anything else is left as it is.
      if v and string.sub(v, 1, 4) == 'sl1.' and string.byte(v, -1) ~= 30 then
        redis.call('SET', KEYS[j], v .. QUEUED_MARK, 'KEEPTTL')
      end
    end
  end
  table.insert(held, 1, 0)
  return held
end
for j = 1, n do
  redis.call('SET', KEYS[j], vals[j] or ARGV[1], 'PX', ARGV[2])
end
if mine == n then
  return fences({2}, true)
end
return fences({1}, false)
