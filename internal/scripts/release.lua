-- Compare-and-delete, handing the lock to the first live queued waiter
-- (handover.lua, included below, has the queue's details).
-- KEYS[1] lock key
-- ARGV[1] token; ARGV[2] the queue entry of the releaser's next local
-- waiter, or nothing; ARGV[3] '1' to hand the lock to that waiter before
-- any queued one.
--
-- A key that may have queued waiters holds its token followed by the mark
-- "\30" (a byte no owner id, and so no token, ends in): the mark is set by
-- a waiter that queues and by every hand-over. A key without it has nobody
-- queued, and its release is a plain compare-and-delete: the uncontended
-- path pays nothing for the queue.
--
-- A marked key that nobody is handed is deleted and announced free
-- (announce_free, for batch waiters, which mark the keys they wait for).
--
-- Returns 1 when the key held the token and was deleted, 0 when the key is
-- gone (expired), -1 when another token, another value or a key of another
-- type holds it, 2 when the key was handed
-- to a queued waiter (ARGV[2], if given, queued behind it), {3, fence}
-- when it was handed to ARGV[2]'s waiter, and -2 when a forced release
-- (force_release.lua) took the key from the token.
--
-- A release leaves nothing behind. A release that handed the key to
-- ARGV[2]'s waiter answers the same when run again (a re-send): that
-- waiter holds the key until it hears this call's answer, so a re-send
-- finds its token there and answers {3, fence}. Any other re-send finds
-- the key gone or someone else's; the caller, which knows its first send's
-- reply was lost, reads that as released while the lock was valid
-- (releaseResult in manager/release.go).
-- #include names.lua (the helper keys' suffixes, the queued mark)
local k = KEYS[1]
local v = redis.pcall('GET', k)
local nxt = ARGV[2] or ''
if v == ARGV[1] and nxt == '' then
  redis.call('DEL', k)
  return 1
end
-- #include prelude.lua (is_mine, forced: after the fast path, which returns without them)
if not is_mine(v, ARGV[1]) then
  if nxt ~= '' and type(v) == 'string' then
    -- Handed to ARGV[2]'s waiter by an earlier run: that waiter learns of
    -- it only from this call's answer, so the key still holds its token.
    local f, tok = string.match(nxt, '^%d+:%d+:([01]):(.+)$')
    if tok and v == tok .. QUEUED_MARK then
      local fence = 0
      if f == '1' then fence = tonumber(redis.pcall('GET', k .. FENCE_SUFFIX)) or 0 end
      return {3, fence}
    end
  end
  if forced(k, ARGV[1]) then return -2 end
  if v == false then return 0 end
  return -1
end
-- #include handover.lua (after the fast path: its functions cost nothing there)
if nxt ~= '' and ARGV[3] == '1' then
  local tok, fence = grant(k, nxt)
  if tok then return {3, fence} end
end
if hand_over(k) then
  if nxt ~= '' then enqueue(k .. QUEUE_SUFFIX, nxt) end
  return 2
end
if nxt ~= '' then
  local tok, fence = grant(k, nxt)
  if tok then return {3, fence} end
end
redis.call('DEL', k)
announce_free(k)
return 1
