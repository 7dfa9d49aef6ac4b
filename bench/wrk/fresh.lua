-- wrk: every request carries a fresh Idempotency-Key (never seen before by the server), or none.
-- wrk -s fresh.lua URL -- RUN TOKENS_FILE BODY [nokey]
--   RUN: a number unique to this run (the key's first 8 hex digits), so two runs never
--        share a key; TOKENS_FILE: bearer tokens, one a line, picked at random per request;
--   BODY: the JSON request body, the same for every request;
--   nokey: send no Idempotency-Key (bench/peers' raw routes: a middleware passes them by).
-- One wrk thread (-t1): the counter in the key's last 12 hex digits makes it unique.
local run, body, counter, keyed = 0, "", 0, true
local tokens = {}

function init(args)
  run = tonumber(args[1])
  for line in io.lines(args[2]) do
    if line ~= "" then tokens[#tokens + 1] = line end
  end
  body = args[3]
  keyed = args[4] ~= "nokey"
  math.randomseed(run)
end

function request()
  counter = counter + 1
  local key = string.format("%08x-%04x-4%03x-a%03x-%012x", run % 0x100000000,
    math.random(0, 0xffff), math.random(0, 0xfff), math.random(0, 0xfff), counter)
  local headers = {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. tokens[math.random(#tokens)],
  }
  if keyed then headers["Idempotency-Key"] = key end
  return wrk.format("POST", nil, headers, body)
end

-- The latency distribution for bench/plots.py: one line of percentile=microseconds pairs.
function done(summary, latency, requests)
  local points = {1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 97.5, 99, 99.5, 99.9}
  local parts = {}
  for _, p in ipairs(points) do
    parts[#parts + 1] = string.format("%g=%d", p, latency:percentile(p))
  end
  io.write("idem-percentiles " .. table.concat(parts, ",") .. "\n")
end
