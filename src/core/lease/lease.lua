-- Read a live lease whole: its owner, its time left and its token.
-- KEYS[1]  the lease key
-- KEYS[2]  the lease's companion key ("<token>:<transfer id>:<holder's length>:<holder>
--          <metadata>", see acquire.lua)
-- ARGV[1]  "waiting" when the caller waits for the key (it listens for its release: a waiter
--          reads the lease it was refused before it waits); absent otherwise
-- Returns  {owner, pttl, token} (pttl -1 when the key has no expiry: written without PX by
--          another client; token false when the lease has none: one no fenced call granted,
--          or granted by another client), or false when no lease is live.
-- Atomically: the reads see one moment, so the token is the owner's.
--
-- A waiter's read marks the lease as waited for: release.lua and transfer.lua publish only for
-- a lease with a companion key, so that a lease nobody waits for (Mastra's own calls) costs
-- Redis no publish. A lease without a companion key gets ":::", one naming no holder; one
-- whose companion key may not live as long as the lease (a transfer's id alone, kept on a
-- cluster; a leftover naming another holder) keeps that key at least as long as the lease.
-- The mark lives as long as the lease did when it was made: a renewal does not extend it,
-- and the waiter, whose timer runs out with it, looks again and marks the lease again.
local owner = redis.call('GET', KEYS[1])
if not owner then
  return false
end
local pttl = redis.call('PTTL', KEYS[1])
-- A companion key naming another holder is a leftover of a grant written without it.
local companion = redis.call('GET', KEYS[2])
local token, lasting
if companion then
  local t, n, at = string.match(companion, '^(%d*):[^:]*:(%d*):()')
  if n and n ~= '' and string.sub(companion, at, at + n - 1) == owner then
    token = t ~= '' and t or nil
    -- Holding a token or metadata, it lives as long as the lease.
    lasting = token or at + n <= #companion
  end
end
if ARGV[1] == 'waiting' and not lasting then
  -- (SET, not PEXPIRE or PERSIST: the least-privileged ACL user of docs/security.md has it.)
  if pttl == -1 then
    redis.call('SET', KEYS[2], companion or ':::')
  elseif pttl > 0 and (not companion or redis.call('PTTL', KEYS[2]) < pttl) then
    redis.call('SET', KEYS[2], companion or ':::', 'PX', pttl)
  end
end
return {owner, pttl, token and tonumber(token) or false}
