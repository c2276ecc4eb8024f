-- Acquire a lock, or queue up for it: the first attempt and the re-checks
-- of a waiting Acquire (release.lua hands the lock to queued waiters;
-- handover.lua, included below, has the queue's details).
-- KEYS[1] lock key, KEYS[2] its waiter queue, KEYS[3] its fence counter (only
-- when taking a fence: a declared key that does not exist makes Redis answer
-- TRYAGAIN while the slot migrates)
-- ARGV[1] token, ARGV[2] TTL in milliseconds, ARGV[3] '1' to take a fence,
-- ARGV[4] the waiter's queue entry (see handover.lua), ARGV[5] '1' when the
-- entry may be queued already (a re-check).
-- Returns {1, fence} when this call set the key (a re-check that did also
-- takes its entry out of the queue), {2, fence} when the key already holds
-- this token (a re-sent attempt, or a hand-over, on its claim lease, whose
-- announcement was missed or came late): the key's TTL is then set to
-- ARGV[2] from now, which confirms the claim; {0, pttl} when another token
-- holds it: the entry is then queued (the queue expiring at its latest
-- entry's deadline), unless a re-check finds it there already, and the key
-- gets release.lua's queued mark "\30". pttl is the key's remaining TTL in
-- milliseconds on a re-check (when the waiter is to look again if nobody
-- hands it the key), else 0.
-- A key that holds anything but a shardlock token (another value, another
-- type) is held by someone else too, but is never written: no mark.
-- The fence is taken (take_fence, fence.lua) before the key is set: a
-- counter that is not an integer makes an error reply with nothing written. A queue key
-- of another type is left alone (the waiter then finds the lock by polling).
-- #include handover.lua
local mark = QUEUED_MARK
local v = redis.pcall('GET', KEYS[1])
if v == false then
  local fence = 0
  if ARGV[3] == '1' then
    local err
    fence, err = take_fence(KEYS[3], ARGV[2])
    if not fence then return err end
  end
  if ARGV[5] == '1' then redis.pcall('LREM', KEYS[2], 1, ARGV[4]) end
  local val = ARGV[1]
  if redis.call('EXISTS', KEYS[2]) == 1 then val = val .. mark end -- others still queued
  redis.call('SET', KEYS[1], val, 'PX', ARGV[2])
  return {1, fence}
elseif v == ARGV[1] or v == ARGV[1] .. mark then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if ARGV[3] ~= '1' then return {2, 0} end
  local fence = tonumber(redis.pcall('GET', KEYS[3]))
  if not fence then return redis.error_reply('ERR fence counter is not an integer') end
  return {2, fence}
end
local queued = ARGV[5] == '1' and redis.pcall('LPOS', KEYS[2], ARGV[4])
if type(queued) ~= 'number' then
  queued = enqueue(KEYS[2], ARGV[4])
end
if queued and type(v) == 'string' and string.sub(v, 1, 4) == 'sl1.' and string.sub(v, -1) ~= mark then
  redis.call('SET', KEYS[1], v .. mark, 'KEEPTTL')
end
if ARGV[5] == '1' then return {0, math.max(redis.call('PTTL', KEYS[1]), 0)} end
return {0, 0}
