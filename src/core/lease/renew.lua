-- Extend a lease the holder still holds.
-- KEYS[1]  the lease key
-- KEYS[2]  the lease's metadata key
-- KEYS[3]  the lease's token key
-- ARGV[1]  owner
-- ARGV[2]  ttl in milliseconds (never 0: PEXPIRE 0 would delete the key)
-- ARGV[3]  metadata, "" for none
-- Returns  1 when the TTL was extended, 0 when the holder no longer holds the lease (the key
--          is free, or held by another owner, or by this owner with other metadata).
-- Atomically: an expired lease is gone before this runs, so it is never resurrected, and a
-- lease another holder took in between is never extended on the old holder's behalf. The
-- token stays the lease's; a token key naming another holder is a leftover and left to
-- expire.
if redis.call('GET', KEYS[1]) == ARGV[1] and (redis.call('GET', KEYS[2]) or '') == ARGV[3] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if ARGV[3] ~= '' then
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
  end
  local fence = redis.call('GET', KEYS[3])
  if fence and string.match(fence, '^%d*:[^:]*:(.*)$') == ARGV[1] then
    redis.call('PEXPIRE', KEYS[3], ARGV[2])
  end
  return 1
end
return 0
