-- Claim a lease, or refresh it for the holder that already holds it.
-- KEYS[1]  the lease key (<keyPrefix>:lease:<key>), a string holding the owner
-- KEYS[2]  the lease's companion key (<keyPrefix>:fence:{<tag>}:<key>), holding
--          "<token>:<transfer id>:<holder's length>:<holder><metadata>": the holder's token
--          (empty for none), the last transfer's id (empty but after a cluster's transfer that
--          may reach Redis twice unseen, see transfer.lua), the owner it belongs to, as its
--          length in bytes and its bytes, then its metadata
--          (empty for none), so any bytes in owner and metadata read back whole. It lives as
--          long as the lease while it holds a token or metadata; holding only a transfer's id,
--          only while the transfer may be sent again. Absent for a lease with neither (Mastra's
--          calls). ":::", naming no holder, is a waiter's mark (see lease.lua)
-- KEYS[3]  the slot's token counter (<keyPrefix>:fence:{<tag>}), never expires; declared
--          by a fenced acquire only (every key costs Redis to hand a script)
-- ARGV[1]  owner
-- ARGV[2]  ttl in milliseconds (validated by the caller: 1..maxTtlMs)
-- ARGV[3]  metadata, "" for none (an empty metadata is refused before any I/O)
-- ARGV[4]  "1": a fenced acquire, whose grant carries a token; "0": none is taken;
--          "claimed": a plain acquire whose `SET NX` just claimed the key and found its
--          companion key there, a leftover of a grant another client released (Mastra's own
--          backend, an operator's DEL): deleted while the key is still the caller's, so the
--          new grant never inherits it; if it is not, the acquire runs as "0"
-- Returns  {1, owner, token} when the caller holds the lease afterwards (token false when
--          the lease has none), {0, owner, false} when another holder holds it: another
--          owner, or this owner with other metadata.
-- Atomically: the read of the holder and the write that claims or refreshes the key happen
-- as one step, so two holders can never both be told they hold it. A fenced claim takes the
-- next token of the counter, so it is greater than every token granted before for the key; a
-- refresh keeps the lease's token, and a fenced refresh of a lease without one takes one. A
-- companion key naming another holder is a leftover of a grant written without it (by
-- Mastra's own backend, which moves or frees the lease key alone): the lease then has neither
-- token nor metadata.
if ARGV[4] == 'claimed' and redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
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
if holder and holder ~= ARGV[1] then
  return {0, holder, false}
end
local token, id, metadata = '', '', ''
if holder then
  local companion = redis.call('GET', KEYS[2])
  if companion then
    local t, i, n, at = string.match(companion, '^(%d*):([^:]*):(%d*):()')
    if n and n ~= '' and string.sub(companion, at, at + n - 1) == ARGV[1] then
      token, id, metadata = t, i, string.sub(companion, at + n)
    end
  end
  if metadata ~= ARGV[3] then
    return {0, holder, false}
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if token == '' and ARGV[4] == '1' then
  -- A transfer's id stays, so the same transfer sent again still finds it.
  token = redis.call('INCR', KEYS[3])
  redis.call('SET', KEYS[2], token .. ':' .. id .. ':' .. #ARGV[1] .. ':' .. ARGV[1] .. ARGV[3],
    'PX', ARGV[2])
elseif holder and (token ~= '' or metadata ~= '') then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
elseif not holder and ARGV[3] ~= '' then
  redis.call('SET', KEYS[2], '::' .. #ARGV[1] .. ':' .. ARGV[1] .. ARGV[3], 'PX', ARGV[2])
elseif not holder then
  -- A claim: whatever companion key is there is another grant's.
  redis.call('DEL', KEYS[2])
end
return {1, ARGV[1], token ~= '' and tonumber(token) or false}
