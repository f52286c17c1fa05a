-- Hand a held lease from one holder to another with a fresh TTL (and, for a fenced lease, a
-- new token).
-- KEYS[1]  the lease key
-- KEYS[2]  the lease's metadata key
-- KEYS[3]  the lease's token key: "<token>:<transfer id>:<holder>" (the token empty for a
--          lease without one)
-- KEYS[4]  the slot's token counter
-- ARGV[1]  fromOwner
-- ARGV[2]  toOwner
-- ARGV[3]  ttl in milliseconds
-- ARGV[4]  how a send made again is known. Where the client sends a transfer again only
--          knowingly (one server: only this client's own retry after a broken connection),
--          absent (or empty) on the first send and "again" on that one. Where it may send it
--          again unseen (a cluster client's retries), this transfer's id, the same on every
--          send of it, kept in the token key while the transfer may be sent again.
-- ARGV[5]  with an id, how long to keep it in milliseconds (the caller's timeout, at most
--          the ttl); else absent (or empty)
-- ARGV[6]  fromMetadata; absent for none
-- ARGV[7]  toMetadata, stored with the new owner; absent for none
-- Returns  1 when the new holder now holds the lease, 0 when the old one no longer held it,
--          -1 when a send made again knowingly cannot tell which (below).
-- Atomically: the key is overwritten in place, never deleted, so no other owner can claim
-- it in between. A lease with a token gets the counter's next one for its new holder, so a
-- resource that checks tokens refuses the old holder's late writes; one without stays
-- without. The same transfer run again (its reply was lost with a connection): with an id
-- kept in the token key, for a fenced lease or for none, it is found there and answers 1
-- again, refreshing the TTL; a send made again knowingly finds the lease still with its old
-- holder (the first send never ran) and moves it, or answers -1: the lease moved on, by
-- this transfer's first run or by someone else, and nothing here tells which. Any other
-- transfer that finds the new holder already holding the lease answers 0. Without a token and without a kept id, the lease handed over is its key
-- alone, as Mastra's own backend leaves it. A transfer of a lease with a companion key
-- publishes "transferred" on the lease key's name, as a release does, on the classic channel
-- where SPUBLISH is refused (waiters look again; the key is not free, but its holder
-- changed); a lease without one is waited for by nobody (see release.lua), and publishes
-- nothing.
local fromMetadata, toMetadata = ARGV[6] or '', ARGV[7] or ''
local again = ARGV[4] == 'again'
local id = not again and ARGV[4] or ''
local keep = id ~= '' and ARGV[5]
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] and fromMetadata == '' and toMetadata == ''
    and redis.pcall('EXISTS', KEYS[2], KEYS[3]) == 0 then
  -- Mastra's own transfers: no metadata either side, no token, no companion key to read,
  -- nobody waiting (pcall: a user whose ACL lacks EXISTS takes the reads below).
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  if keep then
    redis.call('SET', KEYS[3], ':' .. id .. ':' .. ARGV[2], 'PX', keep)
  end
  return 1
else
  local metadata = redis.call('GET', KEYS[2]) or ''
  local fence = redis.call('GET', KEYS[3])
  local token, kept, named
  if fence then
    token, kept, named = string.match(fence, '^(%d*):([^:]*):(.*)$')
  end
  if current == ARGV[2] and metadata == toMetadata
      and id ~= '' and kept == id and named == ARGV[2] then
    -- This transfer, sent again.
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    if toMetadata ~= '' then
      redis.call('PEXPIRE', KEYS[2], ARGV[3])
    end
    if named == ARGV[2] and token ~= '' then
      redis.call('PEXPIRE', KEYS[3], ARGV[3])
    elseif named == ARGV[2] and keep then
      redis.call('PEXPIRE', KEYS[3], keep)
    end
    return 1
  end
  if current ~= ARGV[1] or metadata ~= fromMetadata then
    if again then
      return -1
    end
    return 0
  end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  if toMetadata ~= '' then
    redis.call('SET', KEYS[2], toMetadata, 'PX', ARGV[3])
  elseif metadata ~= '' then
    redis.call('DEL', KEYS[2])
  end
  if named == ARGV[1] and token and token ~= '' then
    local given = redis.call('INCR', KEYS[4])
    redis.call('SET', KEYS[3], given .. ':' .. id .. ':' .. ARGV[2], 'PX', ARGV[3])
  elseif keep then
    redis.call('SET', KEYS[3], ':' .. id .. ':' .. ARGV[2], 'PX', keep)
  elseif fence then
    -- Another grant's leftover or an earlier transfer's id: never the new holder's.
    redis.call('DEL', KEYS[3])
  end
end
if type(redis.pcall('SPUBLISH', KEYS[1], 'transferred')) == 'table' then
  redis.pcall('PUBLISH', KEYS[1], 'transferred')
end
return 1
