-- Remaining time of a read-write lock's writer or reader, only for its
-- holder (rw.lua, included below, has the layout).
-- KEYS[1] lock key; ARGV[1] token
-- Returns {1, ms} when the token holds the lock or a share of it, {0, 0}
-- when it holds none (its time ran out, or the key is gone), {-1, 0} when
-- another writer or a key that is not a read-write lock holds it.
-- #include rw.lua
local k, tok = KEYS[1], ARGV[1]
local kind = rw_kind(k)
if kind == 'foreign' then return {-1, 0} end
if kind == 'free' then return {0, 0} end
local w = redis.call('HGET', k, 'w')
if w == tok then return {1, math.max(redis.call('PTTL', k), 0)} end
local exp = tonumber(redis.call('HGET', k, 'r:' .. tok))
if exp and exp > now() then return {1, exp - now()} end
if w then return {-1, 0} end
return {0, 0}
