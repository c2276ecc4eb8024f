-- Compare-and-pexpire of several keys of one slot, all or none. Never
-- re-creates a key that has gone.
-- KEYS[1..n] lock keys; ARGV[1] token (a key may also hold it followed by
-- the queued mark "\30", see release.lua), ARGV[2] new TTL in milliseconds
-- Returns 1 when every key held the token and was extended; otherwise
-- extends nothing and returns -1 when another token holds a key, else 0.
-- #include prelude.lua
local cur = redis.call('MGET', unpack(KEYS))
local gone = false
for i = 1, #KEYS do
  local v = cur[i]
  if v == false then
    gone = true
  elseif not is_mine(v, ARGV[1]) then
    return -1
  end
end
if gone then return 0 end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return 1
