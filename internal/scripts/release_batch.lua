-- Compare-and-delete of several keys of one slot.
-- KEYS[1..n] lock keys; ARGV[1] token.
-- Each key that holds the token is deleted; one that holds it with the
-- queued mark (see release.lua) goes to the first live waiter queued for it
-- alone (hand_over, handover.lua), or is deleted and announced free
-- (announce_free) when none is live.
-- Returns one status per key: 1 released (deleted or handed over), 0 gone,
-- -1 held by another token.
-- #include handover.lua
local marked = ARGV[1] .. '\30'
local cur = redis.call('MGET', unpack(KEYS))
local out, plain, freed = {}, {}, {}
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
if #plain > 0 then redis.call('DEL', unpack(plain)) end
for _, k in ipairs(freed) do announce_free(k) end
return out
