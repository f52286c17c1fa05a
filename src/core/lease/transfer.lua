-- Hand a held lease from one holder to another with a fresh TTL (and, for a fenced lease, a
-- new token).
-- KEYS[1]  the lease key
-- KEYS[2]  the lease's companion key: "<token>:<transfer id>:<holder's length>:<holder>
--          <metadata>" (see acquire.lua)
-- KEYS[3]  the slot's token counter
-- ARGV[1]  fromOwner
-- ARGV[2]  toOwner
-- ARGV[3]  ttl in milliseconds
-- ARGV[4]  how a send made again is known. Absent (or empty) on a first send that reaches
--          Redis at most once (a link nothing sends again on but this client, which says so);
--          "again" on this client's own send made again after a broken connection (one
--          server). Where a send may reach Redis again unseen (redis-rs' cluster connection
--          sends a command again when the connection it went on dropped), this transfer's id,
--          the same on every send of it, kept in the companion key while the transfer may be
--          sent again; "again:<id>" on a cluster's send made again knowingly: both at once.
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
-- kept in the companion key, for a fenced lease or for none, it is found there and answers 1
-- again, refreshing the TTL; a send made again knowingly finds the lease still with its old
-- holder (the first send never ran) and moves it, or answers -1: the lease moved on, by
-- this transfer's first run or by someone else, and nothing here tells which. Any other
-- transfer that finds the new holder already holding the lease answers 0. Without a token,
-- metadata or a kept id, the lease handed over is its key alone, as Mastra's own backend
-- leaves it. A transfer of a lease with a companion key publishes "transferred" on the lease
-- key's name, as a release does, on the classic channel where SPUBLISH is refused (waiters
-- look again; the key is not free, but its holder changed); a lease without one is waited
-- for by nobody (see release.lua), and publishes nothing.
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] and not ARGV[6] and redis.pcall('EXISTS', KEYS[2]) == 0 then
  -- Mastra's own transfers, first, before any other work: no metadata either side (none is
  -- sent), no token, no companion key to read, nobody waiting (pcall: a user whose ACL lacks
  -- EXISTS takes the read below).
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  local sent = ARGV[4]
  if sent and sent ~= '' and sent ~= 'again' then
    -- Its id: "<id>" or "again:<id>".
    local id = string.match(sent, '[^:]*$')
    redis.call('SET', KEYS[2], ':' .. id .. ':' .. #ARGV[2] .. ':' .. ARGV[2], 'PX', ARGV[5])
  end
  return 1
end
local again = string.sub(ARGV[4] or '', 1, 5) == 'again'
local id = string.sub(ARGV[4] or '', again and 7 or 1)
local fromMetadata, toMetadata = ARGV[6] or '', ARGV[7] or ''
local keep = id ~= '' and ARGV[5]
-- What the companion key says of the current holder: nothing when it names another.
local companion = redis.call('GET', KEYS[2])
local token, kept, metadata = '', nil, ''
if companion and current then
  local t, i, n, at = string.match(companion, '^(%d*):([^:]*):(%d*):()')
  if n and n ~= '' and string.sub(companion, at, at + n - 1) == current then
    token, kept, metadata = t, i, string.sub(companion, at + n)
  end
end
if current == ARGV[2] and metadata == toMetadata and id ~= '' and kept == id then
  -- This transfer, sent again.
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  if token ~= '' or metadata ~= '' then
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
  elseif keep then
    redis.call('PEXPIRE', KEYS[2], keep)
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
local named = ':' .. id .. ':' .. #ARGV[2] .. ':' .. ARGV[2]
if token ~= '' then
  local given = redis.call('INCR', KEYS[3])
  redis.call('SET', KEYS[2], given .. named .. toMetadata, 'PX', ARGV[3])
elseif toMetadata ~= '' then
  redis.call('SET', KEYS[2], named .. toMetadata, 'PX', ARGV[3])
elseif keep then
  redis.call('SET', KEYS[2], named, 'PX', keep)
elseif companion then
  -- Another grant's leftover, a waiter's mark, an earlier transfer's id or the old holder's
  -- metadata: never the new holder's.
  redis.call('DEL', KEYS[2])
end
if type(redis.pcall('SPUBLISH', KEYS[1], 'transferred')) == 'table' then
  redis.pcall('PUBLISH', KEYS[1], 'transferred')
end
return 1
