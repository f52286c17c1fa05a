-- Deletes one page of a run's entries, sparing each one a consumer group still holds
-- unsettled (in the group's pending list: read, not yet acked or nacked). The check and the
-- deletion are one step, so an entry a consumer reads between the caller's XRANGE and this
-- script is spared, never deleted from under the consumer that holds it.
--
-- KEYS[1]    the stream
-- ARGV[1..]  the ids of the entries to delete (one page, at most a few hundred)
-- Returns    { entries deleted, entries spared because a group holds them }

if redis.call('EXISTS', KEYS[1]) == 0 then
  return { 0, 0 }
end

local groups = {}
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  for i = 1, #group - 1, 2 do
    if group[i] == 'name' then
      groups[#groups + 1] = group[i + 1]
    end
  end
end

local del = { 'XDEL', KEYS[1] }
local spared = 0
for i = 1, #ARGV do
  local held = false
  for _, name in ipairs(groups) do
    if redis.call('XPENDING', KEYS[1], name, ARGV[i], ARGV[i], 1)[1] then
      held = true
      break
    end
  end
  if held then
    spared = spared + 1
  else
    del[#del + 1] = ARGV[i]
  end
end

local deleted = 0
if #del > 2 then
  deleted = redis.call(unpack(del))
end
return { deleted, spared }
