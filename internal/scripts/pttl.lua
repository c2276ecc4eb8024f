-- Remaining TTL of a lock, only for its holder.
-- KEYS[1] lock key; ARGV[1] token (with or without the queued mark "\30",
-- see release.lua)
-- Returns the PTTL in milliseconds (>= 0) when the key holds the token,
-- -1 when the key is gone, -2 when another token, another value or a key
-- of another type holds it.
local v = redis.pcall('GET', KEYS[1])
if v == ARGV[1] or v == ARGV[1] .. '\30' then
  local t = redis.call('PTTL', KEYS[1])
  if t < 0 then return 0 end
  return t
elseif v == false then
  return -1
end
return -2
