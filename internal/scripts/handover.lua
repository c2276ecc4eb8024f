-- The fair queue's hand-over, shared by release.lua, release_batch.lua and
-- acquire_queue.lua: scripts.go puts this file in place of the include
-- line in each of them.
-- #include prelude.lua
-- #include fence.lua
-- #include announce.lua
-- #include entry.lua
--
-- A waiter's entry on "<key>:waiters" is
-- "<deadline ms>:<ttl ms>:<1 to take a fence, else 0>:<token>". The queue
-- and the fence counter "<key>:fence" share the key's slot
-- (sharding.LockKey makes sure); the release scripts derive them (with the
-- suffixes of the prelude, which scripts.go makes from sharding's
-- constants) rather than declare them: Redis answers TRYAGAIN to a script
-- whose declared keys are partly missing from a migrating slot, and a
-- lock's helper keys usually do not exist, so declared helpers would stop
-- every release of a held lock for as long as its slot migrates. They are
-- read through pcall: while a slot migrates, a
-- helper key that has left this node is refused as non-local, and the
-- release then deletes the key without a hand-over (queued waiters find it
-- free when they re-check). The queue is only written after an entry was
-- popped from it here, so a migrating slot never gets a second copy of it.


-- claim_ms is the claim lease of a waiter handed the key from the queue
-- (hand_over): the key lives that long (at most its TTL) until the new
-- holder confirms it by its first renewal, which it sends when three
-- quarters of the lease are left (unless released by then), or by a
-- re-check (acquire_queue.lua); both set the full TTL. A waiter that died while
-- queued holds a key it is handed for no longer than that. It is
-- scripts.ClaimLease; a test keeps the two equal.
local claim_ms = 200

-- grant sets key k to entry e's token, with the queued mark "\30" (see
-- release.lua) and e's TTL, or lease milliseconds if given and shorter,
-- taking a fence first if e asks for one. It returns the token and the
-- fence (0 without); nil and 'junk' for an entry that is not one; nothing
-- when no fence can be taken here (the counter is missing, or not local
-- while a slot migrates, or not an integer).
local function grant(k, e, lease)
  local ttl, f, tok = entry_parts(e)
  if not tok then return nil, 'junk' end
  local fence = 0
  if f == '1' then
    -- Only a counter that is here: the waiter's own attempt, which
    -- declares it, takes the first fence.
    fence = take_fence(k .. FENCE_SUFFIX, ttl, true)
    if not fence then return nil end
  end
  if lease and lease < ttl then ttl = lease end
  redis.call('SET', k, tok .. QUEUED_MARK, 'PX', ttl)
  return tok, fence
end

-- enqueue appends entry e to queue q, which then lives until its latest
-- entry's deadline and no longer. It returns false when q cannot take it
-- (a key of another type): the waiter then finds the lock by polling.
local function enqueue(q, e)
  local deadline = string.match(e, '^(%d+):')
  local n = redis.pcall('RPUSH', q, e)
  if type(n) ~= 'number' then return false end
  if n == 1 then
    redis.call('PEXPIREAT', q, deadline)
  else
    redis.call('PEXPIREAT', q, deadline, 'GT')
  end
  return true
end

-- hand_over gives key k, on its claim lease (claim_ms), to the first live
-- entry of its queue and announces it to that entry's waiter and to the
-- next two entries' (announce, announce.lua). Entries past their deadline (by the server's
-- clock, read once, only when an entry is popped) and entries that are not
-- entries are dropped. It returns true when it handed the key over.
local now
local function hand_over(k)
  local q = k .. QUEUE_SUFFIX
  for _ = 1, 64 do
    local e = redis.pcall('LPOP', q)
    if type(e) ~= 'string' then return false end
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    local d = tonumber(string.match(e, '^(%d+):'))
    if d and d >= now then
      local tok, fence = grant(k, e, claim_ms)
      if tok then
        local nexts = {}
        local nxt = redis.pcall('LRANGE', q, 0, 1)
        if type(nxt) == 'table' and not nxt.err then
          for _, ne in ipairs(nxt) do
            local _, _, nt = entry_parts(ne)
            if nt then nexts[#nexts + 1] = nt end
          end
        end
        announce(k, tok, fence, nexts)
        return true
      end
      if fence ~= 'junk' then
        -- Back where it was; a queue the pop emptied is made anew, with
        -- the expiry of that entry's deadline.
        if redis.call('LPUSH', q, e) == 1 then redis.call('PEXPIREAT', q, d) end
        return false
      end
    end
  end
  return false
end

-- announce_free announces on "<k>:released" that key k was deleted with
-- nobody handed it: the message batch waiters wait for (they mark the keys
-- they wait for, and a marked key's release comes here), and queued
-- waiters, which then look at once. A hand-over is never announced there:
-- it goes to its waiters' own channels (announce.lua).
local function announce_free(k)
  redis.pcall('SPUBLISH', k .. CHANNEL_SUFFIX, 'free')
end
