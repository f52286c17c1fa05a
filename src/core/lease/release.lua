-- Release a lease, only on behalf of its holder.
-- KEYS[1]  the lease key
-- KEYS[2]  the lease's token key
-- ARGV[1]  owner
-- Returns  1 when the lease was deleted, 0 when the owner did not hold it (a no-op).
-- A release publishes "released" on the lease key's name (a shard channel, so on a cluster
-- it stays in the key's shard), waking processes that wait for the key (watch.rs).
-- Atomically: the ownership check and the delete are one step, so a lease another owner
-- acquired or renewed in between is never deleted. The slot's counter stays: the next
-- claim's token is still greater.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  -- pcall: SPUBLISH came with Redis 7.0; before, waiters wake at the lease's TTL instead.
  redis.pcall('SPUBLISH', KEYS[1], 'released')
  return 1
end
return 0
