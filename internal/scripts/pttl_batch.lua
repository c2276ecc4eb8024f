-- Remaining TTL of a batch lock, only for its holder: the smallest PTTL.
-- KEYS[1..n] lock keys; ARGV[1] token (a key may also hold it followed by
-- the queued mark "\30", see release.lua)
-- Returns {1, the smallest PTTL in milliseconds (>= 0)} when every key holds
-- the token, {-1, 0} when another token holds one, else {0, 0} (a key is
-- gone) (replies.go names the statuses).
-- #include prelude.lua
local cur = redis.call('MGET', unpack(KEYS))
local least = -1
local gone = false
for i = 1, #KEYS do
  local v = cur[i]
  if v == false then
    gone = true
  elseif not is_mine(v, ARGV[1]) then
    return {-1, 0}
  else
    local t = redis.call('PTTL', KEYS[i])
    if t < 0 then t = 0 end
    if least < 0 or t < least then least = t end
  end
end
if gone then return {0, 0} end
return {1, least}
