-- Compare-and-delete, announcing the release to waiters.
-- KEYS[1] lock key; ARGV[1] token
-- Returns 1 when the key held the token and was deleted, 0 when the key is
-- gone (expired), -1 when another token holds it. A deletion is announced
-- with SPUBLISH on "<key>:released" (sharding.ChannelName, in the key's
-- slot); pcall, because a server without sharded pub/sub must still
-- release.
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.pcall('SPUBLISH', KEYS[1] .. ':released', '1')
  return 1
elseif v == false then
  return 0
end
return -1
