-- prelude.lua: the helpers every algorithm file uses. script.go joins this
-- file, the algorithm files and dispatch.lua into one script, so each
-- algorithm is a local function of one chunk; and the same parts into a
-- Redis 7 function library, whose one function's body is dispatch.lua.
--
-- Every number here is an integer below 2^53, where Lua's doubles are exact:
-- the Go side refuses limits that could leave that range, and state read
-- back from Redis is checked against MAX. Times and durations are
-- microseconds. Integers are written with fmt('%d', x), never passed to
-- redis.call as Lua numbers (newer Redis versions render large ones as
-- 1.7e+15, which integer arguments reject).
-- bind returns the library functions the scripts use, for dispatch.lua to
-- bind at the start of every call: Redis 7 runs a function library's body
-- without them (math, string and redis.call do not exist yet), so they
-- cannot be bound where they are declared. bind is defined before the
-- locals, so the names in it are the globals.
local function bind()
  return math.floor, string.format, string.match, tonumber, redis.call, redis.pcall
end
local floor, fmt, match, tonumber, call, rpcall

-- MAX is 2^53: state above it cannot have been written by sluice.
local MAX = 9007199254740992

-- BAD is the first reply value of a check whose key holds something sluice
-- did not write (another type, or a value that does not parse). Such a check
-- writes nothing.
local BAD = -1

-- CLOCK is the first reply value of a check of a calendar limit whose
-- periods, as the caller sent them, do not reach this server's clock (see
-- periods). Such a check writes nothing.
local CLOCK = -2

-- pad is added to every expiry, in milliseconds. start raises it when
-- the caller injected the time, so that wall-clock expiry cannot overtake
-- the injected clock.
local pad = 0

-- start begins a script call: it binds the library functions (see bind)
-- and returns the call's clock in microseconds, arg (ARGV[1]) when the
-- caller injected the time, in which case pad is raised, or Redis TIME
-- when arg is "". Every script calls it first.
local function start(arg)
  floor, fmt, match, tonumber, call, rpcall = bind()
  pad = 0
  if arg == '' then
    local t = call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  pad = 86400000
  return tonumber(arg)
end

-- ceil_div returns ceil(a/b) for integers a >= 0, b > 0 (a < 2^53): floor of
-- a double quotient of such integers is exact.
local function ceil_div(a, b)
  local q = floor(a / b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- capped is algorithms.capped: v+add, or, past ceiling, the larger of v and
-- ceiling (a charge fills up to the debt ceiling, never lowers a state above
-- it). mode, in every algorithm below, is 0 for Allow, 1 for Probe (cost is
-- 0; the request must fit 1), 2 for Charge (see package algorithms usage.go)
-- and 4 for Refund (cost is given back, then the answer is a peek: see
-- package algorithms refund.go).
local function capped(v, add, ceiling)
  if v + add <= ceiling then
    return v + add
  end
  if v > ceiling then
    return v
  end
  return ceiling
end

-- px returns the expiry for a key whose state is back to "fresh" after reset
-- microseconds: ceil(reset) in milliseconds, plus one, plus pad.
local function px(reset)
  return fmt('%d', ceil_div(reset, 1000) + 1 + pad)
end

-- pair parses the "a:b" state that several algorithms keep in a string:
-- its two numbers, or nil when it is anything else or a number is past MAX.
local function pair(v)
  local a, b = match(v, '^(%d+):(%d+)$')
  a, b = tonumber(a), tonumber(b)
  if a and a <= MAX and b <= MAX then
    return a, b
  end
  return nil
end

-- refill returns what a bucket misses, in units of 1/period token, given
-- that it missed missing at time at and refills rate units per microsecond:
-- the token bucket's usedAt, and reserve's resync. A clock that steps back
-- (now before at) refills nothing.
local function refill(missing, rate, at, now)
  local elapsed = now - at
  if elapsed <= 0 then
    return missing
  end
  if elapsed > floor(missing / rate) then
    return 0
  end
  return missing - elapsed * rate
end

-- span returns the window that holds now, [start, end), and the end of the
-- window after it: windows of length w aligned to the clock, or, when w is
-- a table, a calendar's periods around now {prev, start, end, next} (see
-- periods).
local function span(w, now)
  if type(w) == 'table' then
    return w[2], w[3], w[4]
  end
  local ws = now - now % w
  return ws, ws + w, ws + 2 * w
end

-- later returns the end of the window that starts at start, and the
-- length of the one after it, for a start not before the window that holds
-- now (ws, we, wn from span): algorithms.later.
local function later(start, ws, we, wn)
  if start == ws then
    return we, wn - we
  elseif start == we then
    return wn, we - ws
  end
  return start + (we - ws), we - ws
end

-- periods returns the calendar periods around now {prev, start, end,
-- next} among six boundaries in a row b1..b6 (microseconds, the caller's
-- clock: the third and fourth hold its now), or nil when this clock is
-- more than a period away from the caller's.
local function periods(now, b1, b2, b3, b4, b5, b6)
  if b2 <= now and now < b3 then
    return { b1, b2, b3, b4 }
  elseif b3 <= now and now < b4 then
    return { b2, b3, b4, b5 }
  elseif b4 <= now and now < b5 then
    return { b3, b4, b5, b6 }
  end
  return nil
end

-- get returns the string at key, nil when the key is missing, or false when
-- it holds another type.
local function get(key)
  local v = rpcall('GET', key)
  if type(v) == 'string' then
    return v
  end
  if v == false then
    return nil
  end
  return false
end
