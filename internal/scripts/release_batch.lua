-- Compare-and-delete of several keys of one slot.
-- KEYS[1..n] lock keys; ARGV[1] token.
-- Each key that holds the token is deleted; one that holds it with the
-- queued mark (see release.lua) goes to the first live waiter queued for it
-- alone (hand_over, handover.lua), or is deleted and announced free
-- (announce_free) when none is live.
-- Returns 1 when every key held the token without the mark and was
-- deleted (the fast path below: an integer, which costs the server less
-- than a table), else one status per key: 1 released (deleted or handed
-- over), 0 gone, -1 held by another token.
-- A release leaves nothing behind: a re-send finds the keys gone or
-- someone else's, which the caller reads as release.lua's are read.
-- #include names.lua
local cur = redis.call('MGET', unpack(KEYS))
-- Fast path: every key holds the token without the mark (nobody queued):
-- every key is deleted, before handover.lua's functions are made (the
-- server makes them anew on every call).
local n, i = #KEYS, 1
while i <= n and cur[i] == ARGV[1] do i = i + 1 end
if i > n then
  redis.call('DEL', unpack(KEYS))
  return 1
end
-- #include handover.lua
local marked = ARGV[1] .. QUEUED_MARK
local out = {}
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
if #plain > 0 then redis.call('DEL', unpack(plain)) end
for _, k in ipairs(freed) do announce_free(k) end
return out
