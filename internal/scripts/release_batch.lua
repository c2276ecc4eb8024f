-- Compare-and-delete of several keys of one slot.
-- KEYS[1..n] lock keys; ARGV[1] token
-- Deletes every key that holds the token, announcing each deletion as
-- release.lua does. Returns one status per key: 1 deleted, 0 gone, -1 held
-- by another token.
local out = {}
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v == ARGV[1] then
    redis.call('DEL', KEYS[i])
    redis.pcall('SPUBLISH', KEYS[i] .. ':released', '1')
    out[i] = 1
  elseif v == false then
    out[i] = 0
  else
    out[i] = -1
  end
end
return out
