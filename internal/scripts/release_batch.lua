-- Compare-and-delete of several keys of one slot.
-- KEYS[1..n] lock keys; ARGV[1] token.
-- Each key that holds the token is deleted; one that holds it with the
-- queued mark goes to the first live waiter queued for it alone, as in
-- release.lua (announced the same way, with its helper keys derived and read
-- through pcall for the same reasons), or is deleted when none is live.
-- Returns one status per key: 1 released (deleted or handed over), 0 gone,
-- -1 held by another token.
local now
local marked = ARGV[1] .. '\30'
local cur = redis.call('MGET', unpack(KEYS))
local out, plain = {}, {}
for i = 1, #KEYS do
  local k, v = KEYS[i], cur[i]
  if v == ARGV[1] then
    out[i] = 1
    plain[#plain + 1] = k -- nobody queued: deleted below, in one DEL
  elseif v == marked then
    out[i] = 1
    local granted = false
    for _ = 1, 64 do
      local e = redis.pcall('LPOP', k .. ':waiters')
      if type(e) ~= 'string' then break end
      if not now then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      local _, _, d, ttl, f, tok = string.find(e, '^(%d+):(%d+):(%d):(.+)$')
      if d and tonumber(d) >= now then
        local fence = 0
        if f == '1' then fence = redis.pcall('INCR', k .. ':fence') end
        if type(fence) ~= 'number' then
          redis.call('LPUSH', k .. ':waiters', e)
          break
        end
        redis.call('SET', k, tok .. '\30', 'PX', ttl)
        redis.pcall('SPUBLISH', k .. ':released', redis.sha1hex(tok) .. ' ' .. fence)
        granted = true
        break
      end
    end
    if not granted then plain[#plain + 1] = k end
  elseif v == false then
    out[i] = 0
  else
    out[i] = -1
  end
end
if #plain > 0 then redis.call('DEL', unpack(plain)) end
return out
