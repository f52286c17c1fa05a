-- Keeps entries a live consumer is still handling from being reclaimed by a sibling: resets
-- their idle time without counting a delivery (XCLAIM ... JUSTID), and only for the entries
-- this consumer still owns; one a sibling has already taken over stays theirs.
--
-- KEYS[1]     the stream
-- ARGV[1]     group
-- ARGV[2]     consumer
-- ARGV[3..]   entry ids (at most a few hundred per call)
-- Returns     how many entries were kept
local claim = { 'XCLAIM', KEYS[1], ARGV[1], ARGV[2], '0' }
for i = 3, #ARGV do
  if redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])[1] then
    claim[#claim + 1] = ARGV[i]
  end
end
local kept = #claim - 5
if kept > 0 then
  claim[#claim + 1] = 'JUSTID'
  redis.call(unpack(claim))
end
return kept
