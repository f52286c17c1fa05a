-- Extend a lease the owner still holds.
-- KEYS[1]  the lease key
-- KEYS[2]  with fencing tokens: the lease's token key
-- ARGV[1]  owner
-- ARGV[2]  ttl in milliseconds (never 0: PEXPIRE 0 would delete the key)
-- Returns  1 when the TTL was extended, 0 when the owner no longer holds the lease.
-- Atomically: an expired lease is gone before this runs, so it is never resurrected, and a
-- lease another owner took in between is never extended on the old owner's behalf. The
-- token stays the lease's. Without fencing tokens a token key is left to expire first: the
-- lease then has none, never another grant's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if #KEYS > 1 then
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
  end
  return 1
end
return 0
