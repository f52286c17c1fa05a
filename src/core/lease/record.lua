-- Read who holds a live lease: its owner and its metadata.
-- KEYS[1]  the lease key
-- KEYS[2]  the lease's companion key ("<token>:<transfer id>:<holder's length>:<holder>
--          <metadata>", see acquire.lua)
-- Returns  {owner, metadata} (metadata false for none), or false when no lease is live.
-- Atomically: both reads see one moment, so the metadata is the owner's; a companion key
-- naming another holder is a leftover, and the owner then has none. Plain GETs: the
-- least-privileged user of the five methods reads records too.
local owner = redis.call('GET', KEYS[1])
if not owner then
  return false
end
local companion = redis.call('GET', KEYS[2])
if companion then
  local n, at = string.match(companion, '^%d*:[^:]*:(%d+):()')
  if n and string.sub(companion, at, at + n - 1) == owner then
    local metadata = string.sub(companion, at + n)
    if metadata ~= '' then
      return {owner, metadata}
    end
  end
end
return {owner, false}
