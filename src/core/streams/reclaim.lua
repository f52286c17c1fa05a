-- One reclaim step: XAUTOCLAIM, and how many times Redis has now delivered each claimed
-- entry, in one round trip.
--
-- XAUTOCLAIM (like XCLAIM) adds one to a claimed entry's delivery counter (XPENDING's
-- times-delivered) but does not return it; XPENDING on each claimed id reads it back. The
-- counter is what lets a message that kills every consumer reading it reach the
-- maxDeliveryAttempts cap, where only nacks counted before.
--
-- KEYS[1]  the stream
-- ARGV[1]  group
-- ARGV[2]  consumer claiming
-- ARGV[3]  min idle time in ms
-- ARGV[4]  cursor to scan from
-- ARGV[5]  COUNT
-- Returns  { next cursor, { [id, fields], ... }, { times delivered, ... } } with the two
--          lists aligned; ids whose entry was deleted are left out (Redis 7 already drops
--          them from the pending list; on 6.2 they come back as nil and are skipped).
local reply = redis.pcall('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5])
if reply.err then
  -- Inside a script the server does not name a command it lacks ('Unknown Redis command
  -- called from script', Valkey's 'Unknown command called from script'): a server without
  -- XAUTOCLAIM (before 6.2, or renamed away) is told as outside one, by name.
  if string.find(reply.err, 'Unknown %a* ?command called from script') then
    return redis.error_reply("ERR unknown command 'XAUTOCLAIM'")
  end
  return reply
end
local claimed = {}
local delivered = {}
for _, entry in ipairs(reply[2]) do
  if type(entry) == 'table' and entry[1] then
    local pending = redis.call('XPENDING', KEYS[1], ARGV[1], entry[1], entry[1], 1)
    local times = 1
    if pending[1] then
      times = pending[1][4]
    end
    claimed[#claimed + 1] = entry
    delivered[#delivered + 1] = times
  end
end
return { reply[1], claimed, delivered }
