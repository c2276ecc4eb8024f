-- Remaining TTL of a lock, only for its holder.
-- KEYS[1] lock key; ARGV[1] token (with or without the queued mark "\30",
-- see release.lua)
-- Returns {1, PTTL in milliseconds (>= 0)} when the key holds the token,
-- {0, 0} when the key is gone, {-1, 0} when another token, another value or
-- a key of another type holds it, {-2, 0} when a forced release took it
-- from the token (replies.go names the statuses).
-- #include prelude.lua
local v = redis.pcall('GET', KEYS[1])
if is_mine(v, ARGV[1]) then
  local t = redis.call('PTTL', KEYS[1])
  if t < 0 then t = 0 end
  return {1, t}
elseif forced(KEYS[1], ARGV[1]) then
  return {-2, 0}
elseif v == false then
  return {0, 0}
end
return {-1, 0}
