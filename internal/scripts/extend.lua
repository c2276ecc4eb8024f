-- Compare-and-pexpire. Never re-creates a key that has gone.
-- KEYS[1] lock key; ARGV[1] token, ARGV[2] new TTL in milliseconds
-- Returns 1 when extended, 0 when the key is gone, -1 when another token
-- holds it.
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
elseif v == false then
  return 0
end
return -1
