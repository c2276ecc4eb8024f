-- Compare-and-pexpire. Never re-creates a key that has gone.
-- KEYS[1] lock key; ARGV[1] token, ARGV[2] new TTL in milliseconds
-- The key holds the token, followed by "\30" while waiters are queued for
-- it (see release.lua); either is the holder's.
-- A fenced lock's counter "<key>:fence" (fence.lua) is renewed with it, so
-- that it outlives the lock; the counter is derived, not declared, and
-- read through pcall, as handover.lua explains (a migrating slot).
-- Returns 1 when extended, 0 when the key is gone, -1 when another token,
-- another value or a key of another type holds it, -2 when a forced
-- release (force_release.lua) took it from the token.
-- #include prelude.lua
local v = redis.pcall('GET', KEYS[1])
if is_mine(v, ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.pcall('PEXPIRE', KEYS[1] .. FENCE_SUFFIX, FENCE_TTL_MS + ARGV[2], 'GT')
  return 1
elseif forced(KEYS[1], ARGV[1]) then
  return -2
elseif v == false then
  return 0
end
return -1
