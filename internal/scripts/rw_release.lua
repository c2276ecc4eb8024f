-- Release a read-write lock (rw.lua, included below, has its layout): a
-- reader gives up its share, a writer the lock; when that leaves the lock
-- with no holder, it goes to the first live waiter queued for it (several
-- readers at once), else the key is deleted.
-- KEYS[1] lock key; ARGV[1] token
-- Returns 1 when the token held the lock and released it, 2 when that
-- handed the lock to queued waiters, 0 when the token holds no share of it
-- (its time ran out, or the key is gone), -1 when another token's writer or
-- a key that is not a read-write lock of shardlock's holds it.
--
-- The same call run twice (a re-send) answers the same: a release leaves
-- its outcome on "<key>:outcome" for 5 s, as "<token>=<answer>", as
-- release.lua does, and a run that finds no share of its token answers
-- from there.
-- #include rw.lua
local k, tok = KEYS[1], ARGV[1]
local function record(out)
  redis.pcall('SET', k .. OUTCOME_SUFFIX, tok .. '=' .. out, 'PX', 5000)
  return out
end
local function replayed(otherwise)
  local r = redis.pcall('GET', k .. OUTCOME_SUFFIX)
  if type(r) == 'string' and string.sub(r, 1, #tok + 1) == tok .. '=' then
    return tonumber(string.sub(r, #tok + 2)) or otherwise
  end
  return otherwise
end

local kind = rw_kind(k)
if kind == 'foreign' then return replayed(-1) end
if kind == 'free' then return replayed(0) end
local w = redis.call('HGET', k, 'w')
if w == tok then
  redis.call('HDEL', k, 'w')
elseif redis.call('HDEL', k, 'r:' .. tok) == 1 then
  local n, latest = rw_readers(k)
  if n > 0 then
    redis.call('PEXPIREAT', k, latest) -- as long as the readers left, no longer
    return record(1)
  end
elseif w then
  return replayed(-1)
else
  return replayed(0)
end
if rw_hand_over(k) then return record(2) end
return record(1)
