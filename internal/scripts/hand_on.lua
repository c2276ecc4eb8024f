-- The hand-over of a lock handed over from the queue, on a server with the
-- conditional SET (Valkey 8.1+, Redis 8.4+; manager/handover_native.go):
-- the queue's first live entry gets the key, and its waiter's process hears
-- it, in one round trip and three commands (LPOP, SET ... IFEQ, SPUBLISH).
-- KEYS[1] lock key
-- ARGV[1] the releaser's token with the queued mark (the key's value);
-- ARGV[2] now, in Unix ms by the releaser's clock; ARGV[3] the claim lease
-- in ms.
--
-- Entries past their deadline (by ARGV[2]) and junk are dropped, as
-- handover.lua drops them; the queue is the one handover.lua keeps, derived
-- from the key and read through pcall (see there).
--
-- Returns 1 when it handed the key to the first live entry's waiter
-- (announced to that waiter's owner only), 0 when the queue holds no live
-- entry (the caller then deletes the key if it is still the token's, and
-- announces it free), and -1 when the script's release is to decide: the
-- key was not ARGV[1] (expired, force-released, another token or type),
-- the first live entry asks for a fence, or the queue could not be read.
-- An entry popped and not handed the key is put back where it was.
-- #include announce.lua
-- #include entry.lua
local k, mine, now, lease = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local q = k .. QUEUE_SUFFIX
-- put_back puts popped entry e, whose deadline is d, back at the head of
-- the queue (with d's expiry if the pop had emptied it).
local function put_back(e, d)
  if redis.call('LPUSH', q, e) == 1 then redis.call('PEXPIREAT', q, d) end
end
for _ = 1, 64 do
  local e = redis.pcall('LPOP', q)
  if type(e) == 'table' then return -1 end
  if not e then return 0 end
  local ttl, f, tok = entry_parts(e)
  local d = tonumber(string.match(e, '^(%d+):'))
  if tok and d >= now and string.sub(tok, -1) ~= QUEUED_MARK then
    if f == '1' then
      put_back(e, d)
      return -1
    end
    local set = redis.pcall('SET', k, tok .. QUEUED_MARK, 'IFEQ', mine, 'PX', math.min(ttl, lease))
    if type(set) == 'table' and set.ok then
      announce(k, tok, 0, nil)
      return 1
    end
    put_back(e, d)
    if type(set) == 'table' and set.err then return set end
    return -1
  end
end
return -1
