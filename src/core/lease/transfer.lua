-- Hand a held lease from one owner to another with a fresh TTL.
-- KEYS[1]  the lease key
-- ARGV[1]  fromOwner
-- ARGV[2]  toOwner
-- ARGV[3]  ttl in milliseconds
-- Returns  1 when toOwner now holds the lease, 0 when fromOwner no longer held it.
-- Atomically: the key is overwritten in place, never deleted, so no other owner can claim
-- it in between.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
