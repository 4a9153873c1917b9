-- dispatch.lua: the script's body. It decides one check per key:
--
--   KEYS[k]                the check's key; a check of mode 3 (charge
--                          once) takes two keys in a row: its key, then its
--                          dedupe key (in the same hash slot)
--   ARGV[1]                "" to read the clock from TIME, or the time in
--                          microseconds (tests only: production never sets
--                          it; expiries then get a day of slack)
--   ARGV[2]                how long a dedupe key lives, in milliseconds
--   ARGV[3]                n, the number of distinct limits in this call
--   ARGV[4 ...]            each limit: algorithm (1 fixed_window,
--                          2 sliding_window, 3 sliding_log, 4 token_bucket,
--                          5 gcra, 6 reserve) plus 10 times the mode of its
--                          checks (0 allow, 1 probe, 2 charge, 3 charge
--                          once, 4 refund, 5 refund once) plus 100 for a
--                          calendar limit, and four parameters (see
--                          script.go); a calendar limit then has six more,
--                          the starts of six periods in a row (see
--                          prelude.lua's periods)
--   ARGV[...]              each check: its limit's number (1 to n), cost;
--                          or, when every check has the same, that one
--                          pair alone (with one check the two forms agree)
--
-- A charge once (store.Once) is a charge when its dedupe key is missing or
-- has passed the time it holds (then set to now plus the TTL, with PX that
-- long), else nothing; either way it answers a probe of its key afterwards,
-- as a long answer whose allowed value is 2 more when it charged nothing.
-- A refund once is the same with a refund.
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
local j = 4
for l = 1, tonumber(ARGV[3]) do
  local a = tonumber(ARGV[j])
  fs[l], ms[l] = decide[a % 10], floor(a / 10) % 10
  p1s[l], p2s[l], p3s[l], p4s[l] = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4])
  j = j + 5
  if a >= 100 then
    -- a calendar limit: its window is the periods around now
    p2s[l] = periods(now, tonumber(ARGV[j]), tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3]),
      tonumber(ARGV[j + 4]), tonumber(ARGV[j + 5]))
    if not p2s[l] then
      fs[l] = false
    end
    j = j + 6
  end
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

-- unknown answers check i whose limit could not be decided: an unknown
-- algorithm (nil) or a calendar this clock is outside of (false).
local function unknown(i, f)
  if f == false then
    put(i, CLOCK, 0, 0, 0)
  else
    put(i, BAD, 0, 0, 0)
  end
end

-- once decides a charge or refund once (mode 2 or 4) on key (dedupe key
-- dk): the charge or refund, if the dedupe key was not set, then a probe,
-- as a long answer for check i.
local function once(i, f, key, dk, p1, p2, p3, cost, cs, p4, mode)
  local dup, seen = 2, rpcall('GET', dk)
  if type(seen) ~= 'string' or (tonumber(seen) or MAX) <= now then
    -- The value is when the key is forgotten, in the call's clock (an
    -- injected one too); PX, plus pad, removes it after that.
    local ttl = tonumber(ARGV[2])
    call('SET', dk, fmt('%d', now + ttl * 1000), 'PX', fmt('%d', ttl + pad))
    dup = 0
    local a = f(key, now, p1, p2, p3, cost, cs, p4, mode)
    if a == BAD then
      call('DEL', dk) -- nothing was charged: a retry must charge
      put(i, BAD, 0, 0, 0)
      return
    end
  end
  local a, rem, retry, reset = f(key, now, p1, p2, p3, 0, '0', p4, 1)
  if a == BAD then
    put(i, BAD, 0, 0, 0)
    return
  end
  long[nlong + 1], long[nlong + 2], long[nlong + 3], long[nlong + 4] = a + dup, rem, retry, reset
  nlong = nlong + 4
  out[i + 1] = -nlong / 4
end

local n, k = #KEYS, 1
if #ARGV == j + 1 then
  -- one limit and cost for every key
  local l = tonumber(ARGV[j])
  local f, cs = fs[l], ARGV[j + 1]
  local cost = tonumber(cs)
  local p1, p2, p3, p4, mode = p1s[l], p2s[l], p3s[l], p4s[l], ms[l]
  if f == fixed_window and cost > 0 and mode == 0 then
    -- fixed_window's common case inline: the field already held a count of
    -- this window and the request fits (see fixed_window.lua).
    local ws, we, wn = span(p2, now)
    local field = fw_field(p2, ws, we)
    R = we - now
    for i = 1, n do
      local c = rpcall('HINCRBY', KEYS[i], field, cs)
      if type(c) == 'number' and c > cost and c <= p1 then
        out[i + 1] = p1 - c
      else
        put(i, fw_counted(KEYS[i], now, p1, ws, we, wn, cost, cs, field, c))
      end
    end
  elseif mode == 3 or mode == 5 then
    n = n / 2
    for i = 1, n do
      if f then
        once(i, f, KEYS[2 * i - 1], KEYS[2 * i], p1, p2, p3, cost, cs, p4, mode - 1)
      else
        unknown(i, f)
      end
    end
  else
    for i = 1, n do
      if f then
        put(i, f(KEYS[i], now, p1, p2, p3, cost, cs, p4, mode))
      else
        unknown(i, f)
      end
    end
  end
else
  n = (#ARGV - j + 1) / 2
  for i = 1, n do
    local l = tonumber(ARGV[j])
    local f = fs[l]
    if not f then
      unknown(i, f)
      if ms[l] == 3 or ms[l] == 5 then
        k = k + 1
      end
    elseif ms[l] == 3 or ms[l] == 5 then
      once(i, f, KEYS[k], KEYS[k + 1], p1s[l], p2s[l], p3s[l], tonumber(ARGV[j + 1]), ARGV[j + 1], p4s[l], ms[l] - 1)
      k = k + 1
    else
      put(i, f(KEYS[k], now, p1s[l], p2s[l], p3s[l], tonumber(ARGV[j + 1]), ARGV[j + 1], p4s[l], ms[l]))
    end
    k = k + 1
    j = j + 2
  end
end
out[1] = R or 0
for k = 1, nlong do
  out[n + 1 + k] = long[k]
end
return out
