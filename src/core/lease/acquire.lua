-- Claim a lease, or refresh it for the owner that already holds it.
-- KEYS[1]  the lease key (<keyPrefix>:lease:<key>), a string holding the owner
-- KEYS[2]  with fencing tokens: the lease's token key (<keyPrefix>:fence:{<tag>}:<key>), same
--          expiry, holding "<token>:<transfer id>:<holder>" (the id empty but after a
--          transfer, the token empty after a transfer without tokens)
-- KEYS[3]  with fencing tokens: the slot's token counter (<keyPrefix>:fence:{<tag>}), never
--          expires
-- ARGV[1]  owner
-- ARGV[2]  ttl in milliseconds (validated by the caller: 1..maxTtlMs)
-- Returns  {1, owner, token} when the caller holds the lease afterwards (token false without
--          fencing tokens), {0, holder, false} when another owner holds it.
-- Atomically: the read of the holder and the write that claims or refreshes the key happen
-- as one step, so two owners can never both be told they hold it. A claim takes the next
-- token of the counter, so it is greater than every token granted before for the key; a
-- refresh keeps the lease's token. A token key naming another holder is a leftover of a grant
-- written without it (by Mastra's own backend, which moves or frees the lease key alone): the
-- refresh then takes a new token, as it does for a lease without one.
local holder = redis.pcall('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if type(holder) == 'table' then
  -- Before Redis 7.0, SET takes NX or GET, not both (any other error comes back below).
  holder = redis.call('GET', KEYS[1])
  if not holder then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  end
end
if holder and holder ~= ARGV[1] then
  return {0, holder, false}
end
if holder then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if #KEYS == 1 then
  return {1, ARGV[1], false}
end
local token, id, named
local fence = holder and redis.call('GET', KEYS[2])
if fence then
  token, id, named = string.match(fence, '^(%d*):([^:]*):(.*)$')
end
if named ~= ARGV[1] then
  token, id = nil, ''
end
if token and token ~= '' then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
else
  -- A transfer's id stays, so the same transfer sent again still finds it.
  token = redis.call('INCR', KEYS[3])
  redis.call('SET', KEYS[2], token .. ':' .. id .. ':' .. ARGV[1], 'PX', ARGV[2])
end
return {1, ARGV[1], tonumber(token)}
