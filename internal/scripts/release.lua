-- Compare-and-delete, handing the lock to the first live queued waiter.
-- KEYS[1] lock key
-- ARGV[1] token; ARGV[2] the queue entry of the releaser's next local
-- waiter, or nothing; ARGV[3] '1' to hand the lock to that waiter before
-- any queued one.
--
-- Waiters queue on the list "<key>:waiters" (acquire_queue.lua), entries
-- "<deadline ms>:<ttl ms>:<1 to take a fence, else 0>:<token>"; an entry
-- past its deadline (Unix ms, by the server's clock, read only when an
-- entry is popped) is dropped, and the queue expires at its latest entry's
-- deadline. A key that may have queued waiters holds its token followed by
-- the mark "\30" (a byte no owner id, and so no token, ends in): the mark
-- is set by a waiter that queues and by every hand-over. A key without it
-- has nobody queued, and its release is a plain compare-and-delete: the
-- uncontended path pays nothing for the queue.
--
-- The queue and the fence counter "<key>:fence" share the key's slot
-- (sharding.LockKey makes sure), so they are derived here rather than
-- declared: the hot path sends one key, and a release during a slot
-- migration is not refused with TRYAGAIN because a helper key is missing.
-- While a slot migrates, a helper key that has left this node cannot be
-- read (Redis refuses it as a non-local key): those calls go through
-- pcall, and the release then deletes the key without a hand-over; queued
-- waiters find it free when they re-check. The queue is only written after
-- an entry was popped from it here, so a migrating slot never gets a second
-- copy of it.
--
-- Returns 1 when the key held the token and was deleted, 0 when the key is
-- gone (expired), -1 when another token holds it, 2 when the key was handed
-- to a queued waiter (announced with SPUBLISH on "<key>:released" as
-- "<sha1 of its token> <fence>"; ARGV[2], if given, queued behind it), and
-- {3, fence} when it was handed to ARGV[2]'s waiter.
local k = KEYS[1]
local v = redis.call('GET', k)
local nxt = ARGV[2] or ''
if v == ARGV[1] and nxt == '' then
  redis.call('DEL', k)
  return 1
end
if v ~= ARGV[1] and v ~= ARGV[1] .. '\30' then
  if v == false then return 0 end
  return -1
end

-- grant sets the key to an entry's token (marked) and returns the token and
-- its fence (0 without); nothing when the fence counter cannot be read here.
local function grant(e)
  local _, _, ttl, f, tok = string.find(e, '^%d+:(%d+):(%d):(.+)$')
  local fence = 0
  if f == '1' then
    fence = redis.pcall('INCR', k .. ':fence')
    if type(fence) ~= 'number' then return nil end
  end
  redis.call('SET', k, tok .. '\30', 'PX', ttl)
  return tok, fence
end

if nxt ~= '' and ARGV[3] == '1' then
  local tok, fence = grant(nxt)
  if tok then return {3, fence} end
end
local q = k .. ':waiters'
local now
for _ = 1, 64 do
  local e = redis.pcall('LPOP', q)
  if type(e) ~= 'string' then break end
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local d = tonumber(string.match(e, '^(%d+):'))
  if d and d >= now then
    local tok, fence = grant(e)
    if not tok then
      redis.call('LPUSH', q, e)
      break
    end
    redis.pcall('SPUBLISH', k .. ':released', redis.sha1hex(tok) .. ' ' .. fence)
    if nxt ~= '' then
      -- queued behind; the queue lives until its last entry's deadline
      local deadline = string.match(nxt, '^(%d+):')
      if redis.call('RPUSH', q, nxt) == 1 then
        redis.call('PEXPIREAT', q, deadline)
      else
        redis.call('PEXPIREAT', q, deadline, 'GT')
      end
    end
    return 2
  end
  -- a waiter past its deadline: dropped
end
if nxt ~= '' then
  local tok, fence = grant(nxt)
  if tok then return {3, fence} end
end
redis.call('DEL', k)
return 1
