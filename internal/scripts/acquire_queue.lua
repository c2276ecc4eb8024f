-- Acquire a lock, or queue up for it: the first attempt and the re-checks
-- of a waiting Acquire (release.lua hands the lock to queued waiters;
-- handover.lua, included below, has the queue's details).
-- KEYS[1] lock key, KEYS[2] its waiter queue, KEYS[3] its fence counter
-- ARGV[1] token, ARGV[2] TTL in milliseconds, ARGV[3] '1' to take a fence,
-- ARGV[4] the waiter's queue entry (see handover.lua), ARGV[5] '1' when the
-- entry may be queued already (a re-check).
-- Returns {1, fence} when this call set the key (a re-check that did also
-- takes its entry out of the queue), {2, fence} when the key already holds
-- this token (a re-sent attempt, or a hand-over whose announcement was
-- missed), {0, 0} when another token holds it: the entry is then queued
-- (the queue expiring at its latest entry's deadline), unless a re-check
-- finds it there already, and the key gets release.lua's queued mark "\30".
-- #include handover.lua
local mark = '\30'
local v = redis.call('GET', KEYS[1])
if v == false then
  if ARGV[5] == '1' then redis.call('LREM', KEYS[2], 1, ARGV[4]) end
  local val = ARGV[1]
  if redis.call('EXISTS', KEYS[2]) == 1 then val = val .. mark end -- others still queued
  redis.call('SET', KEYS[1], val, 'PX', ARGV[2])
  if ARGV[3] == '1' then return {1, redis.call('INCR', KEYS[3])} end
  return {1, 0}
elseif v == ARGV[1] or v == ARGV[1] .. mark then
  if ARGV[3] == '1' then return {2, tonumber(redis.call('GET', KEYS[3]) or '0')} end
  return {2, 0}
end
if ARGV[5] ~= '1' or not redis.call('LPOS', KEYS[2], ARGV[4]) then
  enqueue(KEYS[2], ARGV[4])
end
if string.sub(v, -1) ~= mark then
  redis.call('SET', KEYS[1], v .. mark, 'KEEPTTL')
end
return {0, 0}
