-- Acquire several keys of one slot, all or none.
-- KEYS[1..n] lock keys; with fencing, KEYS[n+1..2n] their fence counters.
-- ARGV[1] token, ARGV[2] TTL in milliseconds, ARGV[3] '1' to take fences.
-- Returns {0, i...} with the (1-based) indices of keys another token holds;
-- else {1, fence...} when this call set the keys, {2, fence...} when every
-- key already held this token (a re-sent attempt; a key may hold it with
-- release.lua's queued mark "\30"). Fences only with fencing.
local fencing = ARGV[3] == '1'
local n = #KEYS
if fencing then n = n / 2 end
local marked = ARGV[1] .. '\30'
local cur = redis.call('MGET', unpack(KEYS, 1, n))
local held, mine, vals = {}, 0, {}
for i = 1, n do
  local v = cur[i]
  if v == ARGV[1] or v == marked then
    mine = mine + 1
    vals[i] = v -- kept as it is: the queued mark of release.lua stays
  elseif v then
    held[#held + 1] = i
  end
end
if #held > 0 then
  table.insert(held, 1, 0)
  return held
end
local out = {1}
if mine == n then out[1] = 2 end
for i = 1, n do
  redis.call('SET', KEYS[i], vals[i] or ARGV[1], 'PX', ARGV[2])
end
if fencing then
  for i = 1, n do
    if mine == n then
      out[#out + 1] = tonumber(redis.call('GET', KEYS[n + i]) or '0')
    else
      out[#out + 1] = redis.call('INCR', KEYS[n + i])
    end
  end
end
return out
