-- Acquire a lock and take a fencing token in one step.
-- KEYS[1] lock key, KEYS[2] fence counter (same slot)
-- ARGV[1] token, ARGV[2] TTL in milliseconds
-- Returns {1, fence} when this call set the key, {2, fence} when the key
-- already holds this token (a re-sent attempt, or the token with the
-- queued mark "\30" of release.lua: the fence is the counter, which nobody
-- else can have moved while we hold the key), {0, 0} when another token,
-- another value or a key of another type holds it.
-- The fence is taken (fence.lua, included below) before the key is set: a
-- counter that is not an integer makes an error reply with nothing written.
-- #include fence.lua
-- #include prelude.lua
local v = redis.pcall('GET', KEYS[1])
if v == false then
  local fence, err = take_fence(KEYS[2], ARGV[2])
  if not fence then return err end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, fence}
elseif is_mine(v, ARGV[1]) then
  local fence = tonumber(redis.pcall('GET', KEYS[2]))
  if not fence then return redis.error_reply('ERR fence counter is not an integer') end
  return {2, fence}
end
return {0, 0}
