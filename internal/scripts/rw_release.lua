-- Release a read-write lock (rw.lua, included below, has its layout): a
-- reader gives up its share, a writer the lock; when that leaves the lock
-- with no holder, it goes to the first live waiters queued for it.
-- KEYS[1] lock key; ARGV[1] token
-- Returns 1 when the token held the lock (or a share) and released it, 2
-- when that handed the lock to queued waiters, 0 when the token holds no
-- share of it (its time ran out, or the key is gone), -1 when another
-- writer or a key that is not a read-write lock of shardlock's holds it.
--
-- A release leaves nothing behind: a lock left with no holder, no queue
-- and no writer waiting is deleted (its last fence goes with it: the
-- clock part of the fence rule keeps fences rising), and a re-send finds
-- no share of its token, which the caller reads as release.lua's answers
-- are read.
-- #include rw.lua
local k, tok = KEYS[1], ARGV[1]
local s = rw_load(k)
if not s then return -1 end
if not s.exists then return 0 end

if s.w == tok then
  redis.call('HDEL', k, 'w', 'we')
  s.w = nil
elseif s.n > 0 and redis.call('HDEL', k, 'r:' .. tok) == 1 then
  s.n = s.n - 1
  redis.call('HSET', k, 'n', s.n)
  if s.n > 0 and (not s.q or rw_live_readers(k, s) > 0) then
    return 1 -- other readers hold it still
  end
elseif s.w then
  return -1
else
  return 0
end
if rw_hand_over(k, s) then return 2 end
if not s.w and s.n == 0 and not s.q and not rw_writer_waits(s) then redis.call('DEL', k) end
return 1
