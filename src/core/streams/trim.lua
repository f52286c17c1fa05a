-- Trims a stream to about its length limit without cutting an entry that a consumer group
-- has not settled: one still pending (read, not acked: a consumer may be handling it, or
-- have died holding it until a sibling reclaims it), or not yet delivered to the group.
-- Only past the hard limit are such entries cut, and then they are counted.
--
-- Where the length limit falls is told by the caller, from earlier runs' answers: the
-- newest entry it saw when `entries-added` was at most this many behind today's. That keeps
-- at least the limit and costs no read of the entries themselves. Without one, the oldest
-- entries are read to find it (at most ARGV[4] of them), as they are past the hard limit,
-- which is rare.
--
-- KEYS[1]  the stream
-- ARGV[1]  the length limit
-- ARGV[2]  where it falls: the entries from this id on are at least the limit ('': unknown)
-- ARGV[3]  the hard limit ('0': none)
-- ARGV[4]  most entries one call removes or reads (a bound on how long it holds Redis)
-- Returns  { entries trimmed, of them entries some group had not settled, entries left,
--            entries-added, last-generated-id } (the last two for the caller's next call)

local function less(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  if #ams ~= #bms then
    return #ams < #bms
  end
  if ams ~= bms then
    return ams < bms
  end
  return tonumber(aseq) < tonumber(bseq)
end

-- The id just after `id`: trimming MINID it removes `id` and everything before.
local function after(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return ms .. '-' .. string.format('%d', tonumber(seq) + 1)
end

-- A field of a flat reply.
local function field(reply, name)
  for i = 1, #reply - 1, 2 do
    if reply[i] == name then
      return reply[i + 1]
    end
  end
end

local limit, hard, budget = tonumber(ARGV[1]), tonumber(ARGV[3]), tonumber(ARGV[4])
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local length = field(info, 'length')
local added = field(info, 'entries-added')
local last = field(info, 'last-generated-id')
if length <= limit then
  return { 0, 0, length, added, last }
end

-- The id `n` entries in from the oldest, read when the caller could not tell it.
local function nth(n)
  local page = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', n)
  return page[#page][1]
end

-- The groups, and the oldest entry any of them still needs.
local groups = {}
local floor = nil
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, delivered = field(group, 'name'), field(group, 'last-delivered-id')
  groups[#groups + 1] = { name, delivered }
  local first = redis.call('XPENDING', KEYS[1], name, '-', '+', 1)[1]
  local needed = first and first[1] or after(delivered)
  if floor == nil or less(needed, floor) then
    floor = needed
  end
end

-- Down to the length limit, but not past the floor.
local cut = ARGV[2]
if cut == '' then
  cut = nth(math.min(length - limit, budget) + 1)
end
if floor ~= nil and less(floor, cut) then
  cut = floor
end
local trimmed = redis.call('XTRIM', KEYS[1], 'MINID', cut)

-- Past the hard limit, whatever the floor: the entries some group had not settled are lost,
-- and counted.
local function unsettled(id)
  for _, group in ipairs(groups) do
    if less(group[2], id) or redis.call('XPENDING', KEYS[1], group[1], id, id, 1)[1] then
      return true
    end
  end
  return false
end
local lost = 0
length = length - trimmed
if hard > 0 and length > hard then
  local over = math.min(length - hard, budget)
  local page = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', over + 1)
  local hard_cut = page[#page][1]
  for i = 1, over do
    if unsettled(page[i][1]) then
      lost = lost + 1
    end
  end
  local cut_hard = redis.call('XTRIM', KEYS[1], 'MINID', hard_cut)
  trimmed = trimmed + cut_hard
  length = length - cut_hard
end
return { trimmed, lost, length, added, last }
