-- next_fence and take_fence, shared by the scripts that hand out fences: scripts.go puts
-- this file in place of the include line in each of them.
-- #include names.lua
--
-- A fence is the larger of the counter at fk plus one and the server's
-- clock in microseconds (TIME), and it is stored back as the counter. The
-- clock part keeps fences rising across an unplanned failover, which can
-- lose the latest writes to the counter: the new master's clock has moved
-- on past every fence the old one handed out, as long as the two clocks
-- agree to within the time the failover took.
--
-- The same clock part lets the counter expire: take_fence stores it for
-- FENCE_TTL_MS (scripts.FenceTTL, an hour) plus the lock's TTL, and
-- extend.lua renews it with the lock. A counter that expired long after
-- its last fence gives way to the clock, which has moved on by at least
-- that hour since (unless it was stepped back by more than that).
--
-- next_fence is that rule: the fence after last.
local function next_fence(last)
  local t = redis.call('TIME')
  return math.max(last + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
end

-- take_fence returns the fence, stored at fk for FENCE_TTL_MS plus ttl
-- milliseconds (the TTL of the lock it fences); or nil and an error reply, with nothing
-- written, when the counter is not a non-negative integer below 2^53 (the
-- largest a script's number holds exactly) or is a key of another type.
-- With existing, a counter that is not here is not created either (nil and
-- no reply): a script that derives fk rather than declaring it may run on
-- the target of a migrating slot whose source still has the counter, and a
-- second copy would stop MIGRATE with BUSYKEY.
local function take_fence(fk, ttl, existing)
  local c = redis.pcall('GET', fk)
  if type(c) == 'table' then return nil, c end -- WRONGTYPE, or not on this node
  if not c and existing then return nil end
  local n = 0
  if c then
    n = tonumber(c)
    if not string.match(c, '^%d+$') or not n or n >= 9007199254740992 then
      return nil, redis.error_reply('ERR fence counter ' .. fk .. ' is not an integer')
    end
  end
  local f = next_fence(n)
  redis.call('SET', fk, string.format('%d', f), 'PX', FENCE_TTL_MS + (tonumber(ttl) or 0))
  return f
end
