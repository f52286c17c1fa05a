-- Extend a lease the holder still holds.
-- KEYS[1]  the lease key
-- KEYS[2]  the lease's companion key ("<token>:<transfer id>:<holder's length>:<holder>
--          <metadata>", see acquire.lua)
-- ARGV[1]  owner
-- ARGV[2]  ttl in milliseconds (never 0: PEXPIRE 0 would delete the key)
-- ARGV[3]  metadata; absent for none
-- Returns  1 when the TTL was extended, 0 when the holder no longer holds the lease (the key
--          is free, or held by another owner, or by this owner with other metadata).
-- Atomically: an expired lease is gone before this runs, so it is never resurrected, and a
-- lease another holder took in between is never extended on the old holder's behalf. A
-- companion key holding the holder's token or metadata lives as long as the lease; one
-- naming another holder is a leftover, and one holding only a transfer's id outlives the
-- transfer's resending, not the lease: both are left to expire.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
-- Mastra's own renewals: no metadata (none is sent), and (one command where a read would do)
-- no companion key to keep alive beside the lease. (pcall: a user whose ACL lacks EXISTS
-- takes the read below.)
if not ARGV[3] and redis.pcall('EXISTS', KEYS[2]) == 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
local metadata = ARGV[3] or ''
local token, held = '', ''
local companion = redis.call('GET', KEYS[2])
if companion then
  local t, n, at = string.match(companion, '^(%d*):[^:]*:(%d*):()')
  if n and n ~= '' and string.sub(companion, at, at + n - 1) == ARGV[1] then
    token, held = t, string.sub(companion, at + n)
  end
end
if held ~= metadata then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if token ~= '' or held ~= '' then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1
