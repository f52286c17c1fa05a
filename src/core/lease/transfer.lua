-- Hand a held lease from one owner to another with a fresh TTL (and, with fencing tokens, a
-- new token).
-- KEYS[1]  the lease key
-- KEYS[2]  the lease's token key: "<token>:<transfer id>:<holder>" (the token empty without
--          fencing tokens)
-- KEYS[3]  with fencing tokens: the slot's token counter
-- ARGV[1]  fromOwner
-- ARGV[2]  toOwner
-- ARGV[3]  ttl in milliseconds
-- ARGV[4]  this transfer's id, the same on every send of it
-- Returns  1 when toOwner now holds the lease, 0 when fromOwner no longer held it.
-- Atomically: the key is overwritten in place, never deleted, so no other owner can claim
-- it in between. With tokens, the new holder gets the counter's next token, so a resource
-- that checks tokens refuses the old holder's late writes. The token key remembers the
-- transfer's id, tokens or not: the same transfer run again (its reply was lost with a
-- connection, or a cluster client sent it again after a reconnect) finds it and answers 1
-- again, refreshing the TTL; any other transfer that finds toOwner already holding the lease
-- answers 0. A transfer publishes "transferred" on the lease key's name, as a release does,
-- on the classic channel where SPUBLISH is refused (waiters look again; the key is not free,
-- but its holder changed).
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  local token = #KEYS > 2 and redis.call('INCR', KEYS[3]) or ''
  redis.call('SET', KEYS[2], token .. ':' .. ARGV[4] .. ':' .. ARGV[2], 'PX', ARGV[3])
  if type(redis.pcall('SPUBLISH', KEYS[1], 'transferred')) == 'table' then
    redis.pcall('PUBLISH', KEYS[1], 'transferred')
  end
  return 1
end
if current == ARGV[2] then
  local fence = redis.call('GET', KEYS[2])
  local _, id, named
  if fence then
    _, id, named = string.match(fence, '^(%d*):([^:]*):(.*)$')
  end
  if id == ARGV[4] and named == ARGV[2] then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
    return 1
  end
end
return 0
