-- Forced release (Manager.ForceRelease): remove a lock whoever holds it,
-- handing it to the first live queued waiter as a release would, and leave
-- a record of who forced it and why, so that the evicted holder's next
-- renewal, release or TTL read answers Forced (replies.go) instead of
-- "someone else's" (put_record: while the slot migrates, only where the
-- record is, or can be made without a second copy).
-- KEYS[1] lock key; ARGV[1] "<who>|<why>"; ARGV[2] the record's TTL in ms.
-- Returns {1, token} when the key was deleted, {2, token} when it was
-- handed to a queued waiter (token: the evicted holder's, for the forcing
-- process's log, which names its owner only), {0, ''} when the key is
-- gone, {-1, ''} when it holds something that is not a shardlock token
-- (left alone: shardlock never writes over it).
-- #include handover.lua
local k = KEYS[1]
local v = redis.pcall('GET', k)
if v == false then return {0, ''} end
if type(v) ~= 'string' or string.sub(v, 1, 4) ~= 'sl1.' then return {-1, ''} end
local tok, marked = v, false
if string.sub(v, -1) == QUEUED_MARK then
  tok, marked = string.sub(v, 1, -2), true
end
put_record(k .. FORCED_SUFFIX, k, tok .. '=' .. ARGV[1], ARGV[2])
if marked and hand_over(k) then return {2, tok} end
redis.call('DEL', k)
if marked then announce_free(k) end
return {1, tok}
