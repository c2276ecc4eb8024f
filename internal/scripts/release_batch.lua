-- Compare-and-delete of several keys of one slot.
-- KEYS[1..n] lock keys; ARGV[1] token.
-- Each key that holds the token is deleted; one that holds it with the
-- queued mark (see release.lua) goes to the first live waiter queued for it
-- alone (hand_over, handover.lua), or is deleted and announced free
-- (announce_free) when none is live.
-- Returns one status per key: 1 released (deleted or handed over), 0 gone,
-- -1 held by another token.
-- The same call run twice (a re-send) answers the same: a release that
-- released a key leaves its statuses on "<KEYS[1]>:outcome" (see
-- release.lua), and a run that released nothing answers from there: the
-- fast path renames KEYS[1] to the record (the token: every key released),
-- kept for the rest of the lock's TTL; the slow path writes
-- "<token>=<status>,..." there for 5 s.
-- #include names.lua
local cur = redis.call('MGET', unpack(KEYS))
local outcome = KEYS[1] .. OUTCOME_SUFFIX
local mine = ARGV[1] .. '='
-- Fast path: every key holds the token without the mark (nobody queued):
-- KEYS[1] becomes the record and the others are deleted, before
-- handover.lua's functions are made (the server makes them anew on every
-- call).
local n, out = #KEYS, {}
while #out < n and cur[#out + 1] == ARGV[1] do out[#out + 1] = 1 end
if #out == n then
  if redis.pcall('RENAME', KEYS[1], outcome).err then
    redis.call('DEL', KEYS[1]) -- no record where the slot migrates (see release.lua)
  end
  if n > 1 then redis.call('DEL', unpack(KEYS, 2)) end
  return out
end
-- #include handover.lua
local marked = ARGV[1] .. QUEUED_MARK
out = {}
local plain, freed = {}, {}
for i = 1, #KEYS do
  local k, v = KEYS[i], cur[i]
  if v == ARGV[1] then
    out[i] = 1
    plain[#plain + 1] = k -- nobody queued: deleted below, in one DEL
  elseif v == marked then
    out[i] = 1
    if not hand_over(k) then
      plain[#plain + 1] = k
      freed[#freed + 1] = k
    end
  elseif v == false then
    out[i] = 0
  else
    out[i] = -1
  end
end
local any = false
for i = 1, #KEYS do any = any or out[i] == 1 end
if not any then
  local r = redis.pcall('GET', outcome)
  if r == ARGV[1] then -- renamed by the fast path: every key released
    for i = 1, #KEYS do out[i] = 1 end
    return out
  end
  if type(r) == 'string' and string.sub(r, 1, #mine) == mine then
    local prev = {}
    for n in string.gmatch(string.sub(r, #mine + 1), '-?%d+') do prev[#prev + 1] = tonumber(n) end
    if #prev == #KEYS then return prev end
  end
  return out
end
if #plain > 0 then redis.call('DEL', unpack(plain)) end
for _, k in ipairs(freed) do announce_free(k) end
put_record(outcome, KEYS[1], mine .. table.concat(out, ','), 5000)
return out
