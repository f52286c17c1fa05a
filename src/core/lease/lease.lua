-- Read a live lease whole: its owner, its time left and its token.
-- KEYS[1]  the lease key
-- KEYS[2]  the lease's token key
-- Returns  {owner, pttl, token} (pttl -1 when the key has no expiry: written without PX by
--          another client; token false when the lease has none: one no fenced call granted,
--          or granted by another client), or false when no lease is live.
-- Atomically: the reads see one moment, so the token is the owner's.
local owner = redis.call('GET', KEYS[1])
if not owner then
  return false
end
-- A token key naming another holder is a leftover of a grant written without it.
local fence = redis.call('GET', KEYS[2])
local token, _, named
if fence then
  token, _, named = string.match(fence, '^(%d*):([^:]*):(.*)$')
end
if named ~= owner or token == '' then
  token = nil
end
return {owner, redis.call('PTTL', KEYS[1]), token and tonumber(token) or false}
