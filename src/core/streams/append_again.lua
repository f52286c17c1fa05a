-- Appends events again after a connection broke under their first append, each exactly
-- once: an event that did land (only its reply was lost with the connection) is found among
-- the entries appended since, by its `id`, and is not appended a second time.
--
-- KEYS[1]     the stream
-- ARGV[1]     how long ago the first append was sent, in ms: older entries are not looked at
--             (with a second more, for a server clock that stepped)
-- ARGV[2]     most entries to look at (also at most 4 MiB of events)
-- ARGV[3]     MAXLEN ~ threshold; '0' does not trim
-- ARGV[4]     idle TTL in ms; '0' sets none
-- ARGV[5..]   pairs: the event's id, the payload for its `event` field
-- Returns     per event, in order, its entry id (found or appended), or false when more
--             came since than could be looked at: then it was neither found nor appended
local now = redis.call('TIME')
local since = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - tonumber(ARGV[1]) - 1000
if since < 0 then
  since = 0
end
local wanted = {}
local missing = 0
for i = 5, #ARGV, 2 do
  if wanted[ARGV[i]] == nil then
    missing = missing + 1
  end
  wanted[ARGV[i]] = false
end

-- Newest first, a page at a time, until `since`, or until ARGV[2] entries or SCAN_BYTES of
-- events were looked at: then what is left cannot be told.
local SCAN_BYTES = 4 * 1024 * 1024
local limit = tonumber(ARGV[2])
local seen, bytes = 0, 0
local complete = false
local upper = '+'
while true do
  local page = redis.call('XREVRANGE', KEYS[1], upper, string.format('%d', since), 'COUNT', 100)
  for _, entry in ipairs(page) do
    seen = seen + 1
    local fields = entry[2]
    for f = 1, #fields - 1, 2 do
      if fields[f] == 'event' then
        bytes = bytes + #fields[f + 1]
        for id in string.gmatch(fields[f + 1], '"id":"([%x%-]+)"') do
          if wanted[id] == false then
            wanted[id] = entry[1]
            missing = missing - 1
          end
        end
      end
    end
  end
  if #page < 100 or missing == 0 then
    complete = true
    break
  end
  if seen >= limit or bytes >= SCAN_BYTES then
    break
  end
  upper = '(' .. page[#page][1]
end

local answers = {}
local appended = false
for i = 5, #ARGV, 2 do
  local found = wanted[ARGV[i]]
  if found then
    answers[#answers + 1] = found
  elseif complete then
    local id
    if ARGV[3] ~= '0' then
      id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'event', ARGV[i + 1])
    else
      id = redis.call('XADD', KEYS[1], '*', 'event', ARGV[i + 1])
    end
    wanted[ARGV[i]] = id
    answers[#answers + 1] = id
    appended = true
  else
    answers[#answers + 1] = false
  end
end
if appended and ARGV[4] ~= '0' then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
return answers
