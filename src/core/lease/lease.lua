-- Read a live lease whole: its owner, its token and the time it has left.
-- KEYS[1]  the lease key
-- KEYS[2]  the lease's token key
-- Returns  {owner, pttl, token} (token false when the lease has none: one granted without
--          fencing tokens, or written by another client), or false when no lease is live.
-- Atomically: the three reads see one moment, so the token is the owner's.
local owner = redis.call('GET', KEYS[1])
if not owner then
  return false
end
local token = redis.call('GET', KEYS[2])
return {owner, redis.call('PTTL', KEYS[1]), token and tonumber(string.match(token, '^%d+')) or false}
