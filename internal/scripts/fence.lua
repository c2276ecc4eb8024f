-- next_fence and take_fence, shared by the scripts that hand out fences: scripts.go puts
-- this file in place of the include line in each of them.
--
-- A fence is the larger of the counter at fk plus one and the server's
-- clock in microseconds (TIME), and it is stored back as the counter. The
-- clock part keeps fences rising across an unplanned failover, which can
-- lose the latest writes to the counter: the new master's clock has moved
-- on past every fence the old one handed out, as long as the two clocks
-- agree to within the time the failover took.
--
-- next_fence is that rule: the fence after last.
local function next_fence(last)
  local t = redis.call('TIME')
  return math.max(last + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
end

-- take_fence returns the fence; or nil and an error reply, with nothing
-- written, when the counter is not a non-negative integer below 2^53 (the
-- largest a script's number holds exactly) or is a key of another type.
-- With existing, a counter that is not here is not created either (nil and
-- no reply): a script that derives fk rather than declaring it may run on
-- the target of a migrating slot whose source still has the counter, and a
-- second copy would stop MIGRATE with BUSYKEY.
local function take_fence(fk, existing)
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
  redis.call('SET', fk, string.format('%d', f))
  return f
end
