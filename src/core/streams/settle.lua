-- Settles a pending entry of a consumer group, but only while `consumer` still owns it.
--
-- Atomically: if the entry is in the group's pending list under `consumer`, optionally
-- append `payload` to the stream as a new entry (a redelivery, with the idle TTL refreshed),
-- then XACK the entry. A sibling that claimed the entry after it sat idle owns it now, so we
-- neither append a duplicate nor ack it from under them. Run twice, the second run finds the
-- entry no longer pending and changes nothing.
--
-- KEYS[1]  the stream
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  entry id
-- ARGV[4]  payload for the redelivery; '' settles without appending (a drop)
-- ARGV[5]  idle TTL in ms; '0' sets none
-- ARGV[6]  the field that holds the payload
-- Returns  1 when the entry was ours and is settled, 0 when it was not ours (or not pending)
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
local owner = pending[1]
if owner == nil or owner[2] ~= ARGV[2] then
  return 0
end
if ARGV[4] ~= '' then
  redis.call('XADD', KEYS[1], '*', ARGV[6], ARGV[4])
  if ARGV[5] ~= '0' then
    redis.call('PEXPIRE', KEYS[1], ARGV[5])
  end
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
return 1
