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
-- ARGV[4]  this transfer's id, the same on every send of it
-- ARGV[5]  how long, in milliseconds, a token key holding only this transfer's id is kept:
--          while the transfer may be sent again (its caller's timeout), at most the ttl
-- ARGV[6]  fromMetadata; absent for none
-- ARGV[7]  toMetadata, stored with the new owner; absent for none
-- Returns  1 when the new holder now holds the lease, 0 when the old one no longer held it.
-- Atomically: the key is overwritten in place, never deleted, so no other owner can claim
-- it in between. A lease with a token gets the counter's next one for its new holder, so a
-- resource that checks tokens refuses the old holder's late writes; one without stays
-- without. The token key remembers the transfer's id, tokens or not: the same transfer run
-- again (its reply was lost with a connection, or a cluster client sent it again after a
-- reconnect) finds it and answers 1 again, refreshing the TTL; any other transfer that finds
-- the new holder already holding the lease answers 0. Without a token, the key holds nothing
-- else and lives only while the transfer may be sent again, so the lease's later calls find
-- no companion key. A transfer publishes "transferred" on the lease key's name, as a release
-- does, on the classic channel where SPUBLISH is refused (waiters look again; the key is not
-- free, but its holder changed).
local fromMetadata, toMetadata = ARGV[6] or '', ARGV[7] or ''
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] and fromMetadata == '' and toMetadata == ''
    and redis.pcall('EXISTS', KEYS[2], KEYS[3]) == 0 then
  -- Mastra's own transfers: no metadata either side, no token, no companion key to read
  -- (pcall: a user whose ACL lacks EXISTS takes the reads below).
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('SET', KEYS[3], ':' .. ARGV[4] .. ':' .. ARGV[2], 'PX', ARGV[5])
else
  local metadata = redis.call('GET', KEYS[2]) or ''
  local fence = redis.call('GET', KEYS[3])
  local token, id, named
  if fence then
    token, id, named = string.match(fence, '^(%d*):([^:]*):(.*)$')
  end
  if current == ARGV[2] and metadata == toMetadata and id == ARGV[4] and named == ARGV[2] then
    -- This transfer, sent again.
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    if toMetadata ~= '' then
      redis.call('PEXPIRE', KEYS[2], ARGV[3])
    end
    redis.call('PEXPIRE', KEYS[3], token ~= '' and ARGV[3] or ARGV[5])
    return 1
  end
  if current ~= ARGV[1] or metadata ~= fromMetadata then
    return 0
  end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  if toMetadata ~= '' then
    redis.call('SET', KEYS[2], toMetadata, 'PX', ARGV[3])
  elseif metadata ~= '' then
    redis.call('DEL', KEYS[2])
  end
  local fenced = named == ARGV[1] and token and token ~= ''
  local given = fenced and redis.call('INCR', KEYS[4]) or ''
  redis.call('SET', KEYS[3], given .. ':' .. ARGV[4] .. ':' .. ARGV[2], 'PX', fenced and ARGV[3] or ARGV[5])
end
if type(redis.pcall('SPUBLISH', KEYS[1], 'transferred')) == 'table' then
  redis.pcall('PUBLISH', KEYS[1], 'transferred')
end
return 1
