-- load.lua: wrk's script for bench-envoy. BENCH_LOAD picks each request's
-- x-user header: spread (one of 10,000 keys), flood (90% "hot", the rest
-- spread), blocked (always "blocked"), steady (one of 10 keys, each
-- well under its limit) or unique (a key no other request uses). When wrk
-- is done it prints one line, "BENCH {json}", that bench-envoy reads.
local mode = os.getenv("BENCH_LOAD") or "spread"
local keys = 10000
-- BENCH_BODY names a file: each request POSTs it (an LLM request body).
local body = nil
-- unique: a prefix of this wrk process, then a count
local prefix, count = "", 0

function init(args)
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16) % 100000)
  prefix = "x" .. math.random(1000000000) .. "-"
  local path = os.getenv("BENCH_BODY")
  if path and path ~= "" then
    local f = assert(io.open(path, "rb"))
    body = f:read("*a")
    f:close()
  end
end

function request()
  local k
  if mode == "blocked" then
    k = "blocked"
  elseif mode == "flood" and math.random() < 0.9 then
    k = "hot"
  elseif mode == "steady" then
    k = "s" .. math.random(10)
  elseif mode == "unique" then
    count = count + 1
    k = prefix .. count
  else
    k = "u" .. math.random(keys)
  end
  if body then
    return wrk.format("POST", nil, {["x-user"] = k, ["content-type"] = "application/json"}, body)
  end
  return wrk.format(nil, nil, {["x-user"] = k})
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"non2xx":%d,"errors":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
