-- Renew a read-write lock's writer or one of its readers (rw.lua, included
-- below, has the layout). Never re-creates a share that has gone.
-- KEYS[1] lock key; ARGV[1] token, ARGV[2] new TTL in milliseconds
-- Returns 1 when extended, 0 when the token holds no share (its time ran
-- out, or the key is gone), -1 when the key is not a read-write lock of
-- shardlock's or another writer holds it.
-- #include rw.lua
local k, tok, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
local kind = rw_kind(k)
if kind == 'foreign' then return -1 end
if kind == 'free' then return 0 end
local w = redis.call('HGET', k, 'w')
if w == tok then
  redis.call('PEXPIRE', k, ttl)
  return 1
end
local exp = tonumber(redis.call('HGET', k, 'r:' .. tok))
if exp and exp > now() then
  rw_add_reader(k, tok, ttl)
  return 1
elseif exp then
  redis.call('HDEL', k, 'r:' .. tok)
end
if w then return -1 end
return 0
