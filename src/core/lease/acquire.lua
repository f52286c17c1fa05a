-- Claim a lease, or refresh it for the owner that already holds it.
-- KEYS[1]  the lease key (<keyPrefix>:lease:<key>), a string holding the owner
-- ARGV[1]  owner
-- ARGV[2]  ttl in milliseconds (validated by the caller: 1..maxTtlMs)
-- Returns  {1, owner} when the caller holds the lease afterwards,
--          {0, holder} when another owner holds it.
-- Atomically: the read of the holder and the write that claims or refreshes the key happen
-- as one step, so two owners can never both be told they hold it.
local holder = redis.call('GET', KEYS[1])
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, ARGV[1]}
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, holder}
end
return {0, holder}
