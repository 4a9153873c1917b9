-- dispatch.lua: the script's body. It decides one check per key:
--
--   KEYS[i]                the check's key
--   ARGV[1]                "" to read the clock from TIME, or the time in
--                          microseconds (tests only: production never sets
--                          it; expiries then get a day of slack)
--   ARGV[2]                n, the number of distinct limits in this call
--   ARGV[3 .. 2+4n]        each limit: algorithm (1 fixed_window,
--                          2 sliding_window, 3 sliding_log, 4 token_bucket,
--                          5 gcra) and three parameters (see script.go)
--   ARGV[3+4n ...]         each check: its limit's number (1 to n), cost;
--                          or, when every check has the same, that one
--                          pair alone (with one key the two forms agree)
--
-- Each algorithm is called as f(key, now, p1, p2, p3, cost, cost_text):
-- cost_text is the cost as the caller wrote it, for commands that take it
-- (a Lua number passed to redis.call is formatted with printf's %.14g,
-- which cost Redis more than the command itself).
--
-- and replies with four integers per check: allowed (1, 0, or BAD),
-- remaining, retry-after and reset-after in microseconds. Limits are sent once
-- per call because concurrent requests mostly share them: the numbers are
-- parsed once.
local now = ARGV[1]
if now == '' then
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(now)
  pad = 86400000
end
local decide = { fixed_window, sliding_window, sliding_log, token_bucket, gcra }
local fs, p1s, p2s, p3s = {}, {}, {}, {}
local j = 3
for l = 1, tonumber(ARGV[2]) do
  fs[l] = decide[tonumber(ARGV[j])]
  p1s[l], p2s[l], p3s[l] = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3])
  j = j + 4
end
local out = {}
if #ARGV == j + 1 then
  -- one limit and cost for every key
  local l = tonumber(ARGV[j])
  local f, cs = fs[l], ARGV[j + 1]
  local cost = tonumber(cs)
  local p1, p2, p3 = p1s[l], p2s[l], p3s[l]
  for i = 1, #KEYS do
    local o = 4 * i - 4
    if f then
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] = f(KEYS[i], now, p1, p2, p3, cost, cs)
    else
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] = BAD, 0, 0, 0
    end
  end
  return out
end
for i = 1, #KEYS do
  local l = tonumber(ARGV[j])
  local f = fs[l]
  local o = 4 * i - 4
  if f then
    out[o + 1], out[o + 2], out[o + 3], out[o + 4] = f(KEYS[i], now, p1s[l], p2s[l], p3s[l], tonumber(ARGV[j + 1]), ARGV[j + 1])
  else
    out[o + 1], out[o + 2], out[o + 3], out[o + 4] = BAD, 0, 0, 0
  end
  j = j + 2
end
return out
