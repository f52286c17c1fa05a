-- Appends payloads again after a connection broke under their first append, each exactly
-- once: a payload that did land (only its reply was lost with the connection) is found among
-- the entries appended since, and is not appended a second time. A payload is unique: it
-- carries the event's random id, and a redelivery its own deliveryAttempt.
--
-- KEYS[1]     the stream
-- ARGV[1]     the field that holds the payload
-- ARGV[2]     how long ago the first append was sent, in ms: older entries are not looked at
--             (with a second more, for a server clock that stepped)
-- ARGV[3]     most entries to look at (also at most 4 MiB of payloads)
-- ARGV[4]     idle TTL in ms; '0' sets none
-- ARGV[5..]   the payloads, in order
-- Returns     per payload, in order, its entry id (found or appended), or false when more
--             came since than could be looked at: then it was neither found nor appended
local now = redis.call('TIME')
local since = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - tonumber(ARGV[2]) - 1000
if since < 0 then
  since = 0
end
local field = ARGV[1]
local wanted = {}
local missing = 0
for i = 5, #ARGV do
  if wanted[ARGV[i]] == nil then
    missing = missing + 1
  end
  wanted[ARGV[i]] = false
end

-- Newest first, a page at a time, until `since`, or until ARGV[3] entries or SCAN_BYTES of
-- payloads were looked at: then what is left cannot be told.
local SCAN_BYTES = 4 * 1024 * 1024
local limit = tonumber(ARGV[3])
local seen, bytes = 0, 0
local complete = false
local upper = '+'
while true do
  local page = redis.call('XREVRANGE', KEYS[1], upper, string.format('%d', since), 'COUNT', 100)
  for _, entry in ipairs(page) do
    seen = seen + 1
    local fields = entry[2]
    for f = 1, #fields - 1, 2 do
      if fields[f] == field then
        local payload = fields[f + 1]
        bytes = bytes + #payload
        if wanted[payload] == false then
          wanted[payload] = entry[1]
          missing = missing - 1
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
for i = 5, #ARGV do
  local found = wanted[ARGV[i]]
  if found then
    answers[#answers + 1] = found
  elseif complete then
    local id = redis.call('XADD', KEYS[1], '*', field, ARGV[i])
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
