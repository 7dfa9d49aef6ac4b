-- wrk: every request repeats a key that already completed (the server replays its answer).
-- wrk -s replay.lua URL -- PAIRS_FILE BODY
--   PAIRS_FILE: "KEY TOKEN" lines made by bench/http_path.py, each key completed once by
--   that token's user with BODY; a pair is picked at random per request.
local body = ""
local pairs_ = {}

function init(args)
  for line in io.lines(args[1]) do
    local key, token = line:match("^(%S+) (%S+)$")
    if key then pairs_[#pairs_ + 1] = { key, token } end
  end
  body = args[2]
  math.randomseed(#pairs_)
end

function request()
  local p = pairs_[math.random(#pairs_)]
  local headers = {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = p[1],
    ["Authorization"] = "Bearer " .. p[2],
  }
  return wrk.format("POST", nil, headers, body)
end
