-- Acquire a lock and take a fencing token in one step.
-- KEYS[1] lock key, KEYS[2] fence counter (same slot)
-- ARGV[1] token, ARGV[2] TTL in milliseconds
-- Returns {1, fence} when this call set the key, {2, fence} when the key
-- already holds this token (a re-sent attempt, or the token with the
-- queued mark "\30" of release.lua: the fence is the counter, which nobody
-- else can have moved while we hold the key), {0, 0} when another token
-- holds it.
local v = redis.call('GET', KEYS[1])
if v == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, redis.call('INCR', KEYS[2])}
elseif v == ARGV[1] or v == ARGV[1] .. '\30' then
  return {2, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
return {0, 0}
