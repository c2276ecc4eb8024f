-- entry_parts, shared by the scripts that hand the lock to a queued waiter
-- (handover.lua, hand_on.lua): scripts.go puts this file in place of the
-- include line in each of them.
--
-- A waiter's entry on "<key>:waiters" is
-- "<deadline ms>:<ttl ms>:<1 to take a fence, else 0>:<token>".
-- entry_parts reads entry e: its TTL (ms) and fencing flag, and the token,
-- which must look like a shardlock token. It returns nothing for junk (a
-- tampered or truncated entry), which the hand-over then drops.
local function entry_parts(e)
  local _, _, ttl, f, tok = string.find(e, '^%d+:(%d+):([01]):(sl1%.%d+%.[%w_-]+%..+)$')
  ttl = tonumber(ttl)
  if not tok or not ttl or ttl < 1 or ttl > 86400000 then return nil end
  return ttl, f, tok
end
