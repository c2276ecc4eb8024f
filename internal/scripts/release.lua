-- Compare-and-delete.
-- KEYS[1] lock key; ARGV[1] token
-- Returns 1 when the key held the token and was deleted, 0 when the key is
-- gone (expired), -1 when another token holds it.
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
elseif v == false then
  return 0
end
return -1
