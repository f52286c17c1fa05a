-- Read who holds a live lease: its owner and its metadata.
-- KEYS[1]  the lease key
-- KEYS[2]  the lease's metadata key
-- Returns  {owner, metadata} (metadata false for none), or false when no lease is live.
-- Atomically: both reads see one moment, so the metadata is the owner's. Plain GETs: the
-- least-privileged user of the five methods reads records too.
local owner = redis.call('GET', KEYS[1])
if not owner then
  return false
end
return {owner, redis.call('GET', KEYS[2])}
