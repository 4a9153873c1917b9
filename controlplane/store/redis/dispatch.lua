-- dispatch.lua: the script's body. It decides one check per key:
--
--   KEYS[i]                the check's key
--   ARGV[1]                "" to read the clock from TIME, or the time in
--                          microseconds (tests only: production never sets
--                          it; expiries then get a day of slack)
--   ARGV[2]                n, the number of distinct limits in this call
--   ARGV[3 .. 2+5n]        each limit: algorithm (1 fixed_window,
--                          2 sliding_window, 3 sliding_log, 4 token_bucket,
--                          5 gcra, 6 reserve) plus 10 times the mode of its
--                          checks (0 allow, 1 probe, 2 charge), and four
--                          parameters (see script.go)
--   ARGV[3+5n ...]         each check: its limit's number (1 to n), cost;
--                          or, when every check has the same, that one
--                          pair alone (with one key the two forms agree)
--
-- Each algorithm is called as f(key, now, p1, p2, p3, cost, cost_text, p4,
-- mode):
-- cost_text is the cost as the caller wrote it, for commands that take it
-- (a Lua number passed to redis.call is formatted with printf's %.14g,
-- which cost Redis more than the command itself).
--
-- The reply is integers, in three parts:
--
--   [1]                    R, the reset-after (microseconds) shared by the
--                          short answers; 0 when there is none
--   [1+i]                  check i's answer: r >= 0 is short for "allowed,
--                          remaining r, retry-after 0, reset-after R";
--                          r < 0 points at the -r'th long answer
--   [2+#KEYS ...]          the long answers, four integers each: allowed
--                          (1, 0, or BAD), remaining, retry-after and
--                          reset-after in microseconds (reserve: an
--                          allowed check's wait instead of retry-after)
--
-- Under load nearly every check is an allowed one in the current window of
-- the same fixed window, whose answers differ only in remaining: turning
-- four reply integers into one cut the script's cost per check by about a
-- tenth (converting a Lua table to a reply costs Redis per element). For the
-- same reason the common case, every check under one fixed_window limit,
-- runs its HINCRBY in the loop below and calls into fixed_window.lua only
-- for the rest. Limits are sent once per call because concurrent requests
-- mostly share them: the numbers are parsed once.
--
-- As a library function it keeps the chunk's locals between calls, so the
-- state of one call (pad, in start, and fw_fields) is reset here.
local now = start(ARGV[1])
fw_fields = {}
local decide = { fixed_window, sliding_window, sliding_log, token_bucket, gcra, reserve }
local fs, p1s, p2s, p3s, p4s, ms = {}, {}, {}, {}, {}, {}
local j = 3
for l = 1, tonumber(ARGV[2]) do
  local a = tonumber(ARGV[j])
  fs[l], ms[l] = decide[a % 10], floor(a / 10)
  p1s[l], p2s[l], p3s[l], p4s[l] = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4])
  j = j + 5
end

local out, long, nlong, R = { 0 }, {}, 0, nil

-- put records check i's answer: short when it can be, else long.
local function put(i, allowed, remaining, retry, reset)
  if allowed == 1 and retry == 0 and (reset == R or R == nil) then
    R = reset
    out[i + 1] = remaining
    return
  end
  long[nlong + 1], long[nlong + 2], long[nlong + 3], long[nlong + 4] = allowed, remaining, retry, reset
  nlong = nlong + 4
  out[i + 1] = -nlong / 4
end

local n = #KEYS
if #ARGV == j + 1 then
  -- one limit and cost for every key
  local l = tonumber(ARGV[j])
  local f, cs = fs[l], ARGV[j + 1]
  local cost = tonumber(cs)
  local p1, p2, p3, p4, mode = p1s[l], p2s[l], p3s[l], p4s[l], ms[l]
  if f == fixed_window and cost > 0 and mode == 0 then
    -- fixed_window's common case inline: the field already held a count of
    -- this window and the request fits (see fixed_window.lua).
    local ws = now - now % p2
    local field = fw_field(p2, ws)
    R = ws + p2 - now
    for i = 1, n do
      local c = rpcall('HINCRBY', KEYS[i], field, cs)
      if type(c) == 'number' and c > cost and c <= p1 then
        out[i + 1] = p1 - c
      else
        put(i, fw_counted(KEYS[i], now, p1, p2, cost, cs, ws, field, c))
      end
    end
  else
    for i = 1, n do
      if f then
        put(i, f(KEYS[i], now, p1, p2, p3, cost, cs, p4, mode))
      else
        put(i, BAD, 0, 0, 0)
      end
    end
  end
else
  for i = 1, n do
    local l = tonumber(ARGV[j])
    local f = fs[l]
    if f then
      put(i, f(KEYS[i], now, p1s[l], p2s[l], p3s[l], tonumber(ARGV[j + 1]), ARGV[j + 1], p4s[l], ms[l]))
    else
      put(i, BAD, 0, 0, 0)
    end
    j = j + 2
  end
end
out[1] = R or 0
for k = 1, nlong do
  out[n + 1 + k] = long[k]
end
return out
