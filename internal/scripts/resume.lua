-- Take over a held lock by its token (Manager.Resume): another process
-- hands the lock on.
-- KEYS[1] lock key; ARGV[1] token, ARGV[2] TTL in milliseconds, ARGV[3]
-- '1' to read the lock's fence.
-- Returns {1, fence} when the key holds the token (with or without the
-- queued mark): its TTL is then set to ARGV[2] from now, and fence is the
-- lock's fence counter (0 unless asked for), which nobody else can have
-- moved while the token holds the key; {0, 0} when the key is gone, {-1, 0}
-- when another token, another value or a key of another type holds it
-- (replies.go names the statuses).
-- #include prelude.lua
local v = redis.pcall('GET', KEYS[1])
if is_mine(v, ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local fence = 0
  if ARGV[3] == '1' then
    fence = tonumber(redis.pcall('GET', KEYS[1] .. FENCE_SUFFIX)) or 0
  end
  return {1, fence}
elseif v == false then
  return {0, 0}
end
return {-1, 0}
