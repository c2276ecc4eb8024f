-- Remaining time of a read-write lock's writer or reader, only for its
-- holder (rw.lua, included below, has the layout).
-- KEYS[1] lock key; ARGV[1] token
-- Returns {1, ms} when the token holds the lock or a share of it, {0, 0}
-- when it holds none (its time ran out, or the key is gone), {-1, 0} when
-- another writer or a key that is not a read-write lock holds it.
-- #include rw.lua
local k, tok = KEYS[1], ARGV[1]
local s = rw_load(k)
if not s then return {-1, 0} end
if s.w == tok then return {1, s.we - now()} end
local exp = s.n > 0 and tonumber(redis.call('HGET', k, 'r:' .. tok))
if exp and exp > now() then return {1, exp - now()} end
if s.w then return {-1, 0} end
return {0, 0}
