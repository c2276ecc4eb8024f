-- Renew a read-write lock's writer or one of its readers (rw.lua, included
-- below, has the layout). Never brings back a share that has gone.
-- KEYS[1] lock key; ARGV[1] token, ARGV[2] new TTL in milliseconds
-- Returns 1 when extended, 0 when the token holds no share (its time ran
-- out, or the key is gone), -1 when the key is not a read-write lock of
-- shardlock's or another writer holds it.
-- #include rw.lua
local k, tok, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
local s = rw_load(k)
if not s then return -1 end
if s.w == tok then
  redis.call('HSET', k, 'we', now() + ttl)
  rw_keep(k, s, now() + ttl)
  return 1
end
local exp = s.n > 0 and tonumber(redis.call('HGET', k, 'r:' .. tok))
if exp and exp > now() then
  rw_add_reader(k, s, tok, ttl, false)
  return 1
end
if s.w then return -1 end
return 0
