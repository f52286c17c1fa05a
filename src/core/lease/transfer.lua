-- Hand a held lease from one owner to another with a fresh TTL.
-- KEYS[1]  the lease key
-- ARGV[1]  fromOwner
-- ARGV[2]  toOwner
-- ARGV[3]  ttl in milliseconds
-- ARGV[4]  "1" on a second send after the connection broke under the first (optional)
-- Returns  1 when toOwner now holds the lease, 0 when fromOwner no longer held it.
-- Atomically: the key is overwritten in place, never deleted, so no other owner can claim
-- it in between. A second send that finds toOwner holding the lease answers 1 and refreshes
-- the TTL: the first send went through, and the lease is where the caller asked for it.
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] or (ARGV[4] == '1' and current == ARGV[2]) then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
