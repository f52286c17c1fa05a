-- Trims a stream to about its length limit without cutting an entry that a consumer group
-- has not settled: one still pending (read, not acked: a consumer may be handling it, or
-- have died holding it until a sibling reclaims it), or not yet delivered to the group.
-- Only past the hard limit are such entries cut, and then they are counted.
--
-- KEYS[1]  the stream
-- ARGV[1]  the length limit (entries beyond it are trimmed once every group settled them)
-- ARGV[2]  the hard limit ('0': none; entries beyond it are trimmed whatever their state)
-- ARGV[3]  most entries one call removes (a bound on how long it holds Redis)
-- Returns  { entries trimmed, of them entries some group had not settled }

-- The id just after `id`: trimming MINID it removes `id` and everything before.
local function after(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return ms .. '-' .. string.format('%d', tonumber(seq) + 1)
end

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

-- The oldest `n` entries.
local function oldest(n)
  return redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', n)
end

local length = redis.call('XLEN', KEYS[1])
local limit = tonumber(ARGV[1])
local hard = tonumber(ARGV[2])
local budget = tonumber(ARGV[3])
if length <= limit then
  return { 0, 0 }
end

-- The groups, and the oldest entry any of them still needs.
local groups = {}
local floor = nil
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, delivered
  for i = 1, #group - 1, 2 do
    if group[i] == 'name' then
      name = group[i + 1]
    elseif group[i] == 'last-delivered-id' then
      delivered = group[i + 1]
    end
  end
  groups[#groups + 1] = { name, delivered }
  local first = redis.call('XPENDING', KEYS[1], name, '-', '+', 1)[1]
  local needed = first and first[1] or after(delivered)
  if floor == nil or less(needed, floor) then
    floor = needed
  end
end

-- Whether some group has not settled entry `id`: not yet delivered to it, or pending.
local function unsettled(id)
  for _, group in ipairs(groups) do
    if less(group[2], id) or redis.call('XPENDING', KEYS[1], group[1], id, id, 1)[1] then
      return true
    end
  end
  return false
end

-- Down to the length limit, but not past the floor (when the floor is the oldest entry,
-- there is nothing to look at).
local trimmed = 0
if floor == nil or less(oldest(1)[1][1], floor) then
  local excess = math.min(length - limit, budget)
  local cut = oldest(excess + 1)[excess + 1][1]
  if floor ~= nil and less(floor, cut) then
    cut = floor
  end
  trimmed = redis.call('XTRIM', KEYS[1], 'MINID', cut)
end

-- Past the hard limit, whatever the floor: the entries some group had not settled are lost,
-- and counted.
local lost = 0
length = length - trimmed
if hard > 0 and length > hard then
  local over = math.min(length - hard, budget)
  local page = oldest(over + 1)
  for i = 1, over do
    if unsettled(page[i][1]) then
      lost = lost + 1
    end
  end
  trimmed = trimmed + redis.call('XTRIM', KEYS[1], 'MINID', page[over + 1][1])
end
return { trimmed, lost }
