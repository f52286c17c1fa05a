-- Release a lease, only on behalf of its holder.
-- KEYS[1]  the lease key
-- KEYS[2]  the lease's companion key ("<token>:<transfer id>:<holder's length>:<holder>
--          <metadata>", see acquire.lua)
-- ARGV[1]  owner
-- ARGV[2]  metadata; absent for none
-- Returns  1 when the lease was deleted, 0 when the holder did not hold it (a no-op).
-- A release of a lease with a companion key publishes "released" on the lease key's name (a
-- shard channel, so on a cluster it stays in the key's shard), waking processes that wait for
-- the key (watch.rs); where SPUBLISH is refused, on the classic channel of that name, where
-- such a server's waiters listen (listener.rs). A lease that is waited for always has one: a
-- waiter marks a lease without one before it waits (lease.lua), so a release of a lease
-- nobody waits for (Mastra's own calls) publishes nothing.
-- Atomically: the check of the holder and the delete are one step, so a lease another
-- holder acquired or renewed in between is never deleted. The slot's counter stays: the
-- next fenced claim's token is still greater.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
-- Mastra's own releases: no metadata, and (one command where a read and a delete would do)
-- no companion key beside the lease, so nobody waits for it either. (pcall: a user whose ACL
-- lacks EXISTS takes the read below.)
if not ARGV[2] and redis.pcall('EXISTS', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[1])
  return 1
end
-- The holder's metadata: the companion key's when it names this owner, else none.
local metadata = ''
local companion = redis.call('GET', KEYS[2])
if companion then
  local n, at = string.match(companion, '^%d*:[^:]*:(%d+):()')
  if n and string.sub(companion, at, at + n - 1) == ARGV[1] then
    metadata = string.sub(companion, at + n)
  end
end
if metadata ~= (ARGV[2] or '') then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2])
-- pcall: a publish that fails (SPUBLISH came with Redis 7.0; a service or an ACL may refuse
-- both) must not fail the release; waiters then wake at the lease's TTL.
if type(redis.pcall('SPUBLISH', KEYS[1], 'released')) == 'table' then
  redis.pcall('PUBLISH', KEYS[1], 'released')
end
return 1
