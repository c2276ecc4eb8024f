-- Take a waiter that gave up out of a read-write lock's queue (rw.lua,
-- included below, has the layout).
-- KEYS[1] lock key; ARGV[1] the waiter's queue entry
-- Returns 1 when the entry was queued and is not now, 0 when it was not
-- there (it may have been handed the lock).
-- #include rw.lua
local s = rw_load(KEYS[1])
if not s or not s.exists then return 0 end
if rw_dequeue(KEYS[1], s, ARGV[1]) then return 1 end
return 0
