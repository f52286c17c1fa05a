-- Claim a lease, or refresh it for the holder that already holds it.
-- KEYS[1]  the lease key (<keyPrefix>:lease:<key>), a string holding the owner
-- KEYS[2]  the lease's metadata key, same expiry, holding the holder's metadata (absent for
--          none): <keyPrefix>:lease-metadata:<key>, Mastra's layout (on a cluster
--          <keyPrefix>:lease-metadata:{<tag>}:<key>, in the lease key's slot)
-- KEYS[3]  the lease's token key (<keyPrefix>:fence:{<tag>}:<key>), same expiry, holding
--          "<token>:<transfer id>:<holder>" (the id empty but after a transfer on a cluster,
--          the token empty for a lease without one; such a key, holding only a transfer's
--          id, lives only while the transfer may be sent again, or a waiter marked the lease;
--          "::", naming no holder, is a waiter's mark: see lease.lua)
-- KEYS[4]  the slot's token counter (<keyPrefix>:fence:{<tag>}), never expires
-- ARGV[1]  owner
-- ARGV[2]  ttl in milliseconds (validated by the caller: 1..maxTtlMs)
-- ARGV[3]  metadata, "" for none (an empty metadata is refused before any I/O)
-- ARGV[4]  "1": a fenced acquire, whose grant carries a token; "0": none is taken;
--          "claimed": a plain acquire whose `SET NX` just claimed the key and found its
--          metadata or token key there, leftovers of a grant another client released (Mastra's
--          own backend, an operator's DEL): deleted while the key is still the caller's, so
--          the new grant never inherits them; if it is not, the acquire runs as "0"
-- Returns  {1, owner, token} when the caller holds the lease afterwards (token false when
--          the lease has none), {0, owner, false} when another holder holds it: another
--          owner, or this owner with other metadata.
-- Atomically: the read of the holder and the write that claims or refreshes the key happen
-- as one step, so two holders can never both be told they hold it. A fenced claim takes the
-- next token of the counter, so it is greater than every token granted before for the key; a
-- refresh keeps the lease's token, and a fenced refresh of a lease without one takes one. A
-- token key naming another holder is a leftover of a grant written without it (by Mastra's
-- own backend, which moves or frees the lease key alone): the lease then has no token.
if ARGV[4] == 'claimed' and redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[2], KEYS[3])
  return {1, ARGV[1], false}
end
local holder = redis.pcall('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if type(holder) == 'table' then
  -- Before Redis 7.0, SET takes NX or GET, not both (any other error comes back below).
  holder = redis.call('GET', KEYS[1])
  if not holder then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  end
end
if holder and (holder ~= ARGV[1] or (redis.call('GET', KEYS[2]) or '') ~= ARGV[3]) then
  return {0, holder, false}
end
if holder then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if ARGV[3] ~= '' then
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
  end
elseif ARGV[3] ~= '' then
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2])
else
  redis.call('DEL', KEYS[2])
end
local token, id, named
local fence = holder and redis.call('GET', KEYS[3])
if fence then
  token, id, named = string.match(fence, '^(%d*):([^:]*):(.*)$')
end
if named ~= ARGV[1] then
  token, id = nil, ''
end
if token and token ~= '' then
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
elseif ARGV[4] == '1' then
  -- A transfer's id stays, so the same transfer sent again still finds it.
  token = redis.call('INCR', KEYS[4])
  redis.call('SET', KEYS[3], token .. ':' .. id .. ':' .. ARGV[1], 'PX', ARGV[2])
else
  token = nil
  if not holder then
    -- A claim: whatever token key is there is another grant's.
    redis.call('DEL', KEYS[3])
  end
end
return {1, ARGV[1], token and tonumber(token) or false}
