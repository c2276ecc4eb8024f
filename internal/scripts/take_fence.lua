-- Take a fence on its own, for a lock key the caller already holds.
-- KEYS[1] the lock's fence counter; ARGV[1] the lock's TTL in milliseconds.
-- Returns the fence (fence.lua's rule, stored back as the counter, with
-- fence.lua's expiry); an
-- error reply, with nothing written, for a counter that is not a
-- non-negative integer or is a key of another type.
-- A fenced acquire takes its key and its fence in one script, except while
-- the lock's slot migrates and that script meets TRYAGAIN (the key, free,
-- is on neither node; the counter is on one): then it takes the key alone
-- and this fence after it. Fences stay rising: every holder takes its
-- fence while it holds the key, and the counter is on one node at a time.
-- #include fence.lua
local f, err = take_fence(KEYS[1], ARGV[1])
if not f then return err end
return f
