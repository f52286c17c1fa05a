-- Extend a lease the holder still holds.
-- KEYS[1]  the lease key
-- KEYS[2]  the lease's metadata key
-- KEYS[3]  the lease's token key
-- ARGV[1]  owner
-- ARGV[2]  ttl in milliseconds (never 0: PEXPIRE 0 would delete the key)
-- ARGV[3]  metadata; absent for none
-- Returns  1 when the TTL was extended, 0 when the holder no longer holds the lease (the key
--          is free, or held by another owner, or by this owner with other metadata).
-- Atomically: an expired lease is gone before this runs, so it is never resurrected, and a
-- lease another holder took in between is never extended on the old holder's behalf. The
-- token stays the lease's; a token key naming another holder is a leftover, and one holding
-- only a transfer's id outlives the transfer's resending, not the lease: both are left to
-- expire.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local metadata = ARGV[3] or ''
-- Mastra's own renewals: no metadata, and (one command where two reads would do) no
-- companion key to keep alive beside the lease. (pcall: a user whose ACL lacks EXISTS
-- takes the reads below.)
if metadata == '' and redis.pcall('EXISTS', KEYS[2], KEYS[3]) == 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if (redis.call('GET', KEYS[2]) or '') ~= metadata then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if metadata ~= '' then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
local fence = redis.call('GET', KEYS[3])
local token, named
if fence then
  token, named = string.match(fence, '^(%d*):[^:]*:(.*)$')
end
-- A lease's token lives as long as the lease; a transfer's id alone (a lease without a token)
-- only as long as the transfer may be sent again (see transfer.lua).
if token and token ~= '' and named == ARGV[1] then
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
return 1
