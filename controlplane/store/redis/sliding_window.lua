-- sliding_window.lua: algorithms.SlidingWindow, line by line, on
-- microseconds (window a length, or a calendar's periods: see prelude.lua's
-- span). State at key: the string "start:prev:cur".
-- Like the Go function, an allowed request or a charge writes the state
-- (unless nothing changed); a denied one writes nothing; a refund (mode 4)
-- takes its cost off the current window's count, never below 0, and
-- answers a peek. A state with both counts 0 behaves exactly like a missing
-- key, so it is deleted rather than written.

-- sw_weight is algorithms.weight: the previous window's weight in
-- thousandths, e elapsed into the current window of length len.
local function sw_weight(len, e)
  if e >= len then
    return 0
  end
  if e < 0 then
    e = 0
  end
  return floor((len - e) * 1000 / len)
end

-- sw_fits_at is SlidingWindow.fitsAt, in a window of length w. room is
-- never negative where it is called, so floor matches Go's truncating
-- division.
local function sw_fits_at(limit, w, prev, cur, cost)
  local room = (limit - cur - cost) * 1000
  if prev == 0 then
    return 0, room >= 0
  end
  local q = floor(room / prev)
  if q >= 1000 then
    return 0, true
  end
  local at = w - ceil_div((q + 1) * w, 1000) + 1
  if at < 0 then
    at = 0
  end
  return at, at < w
end

-- sw_retry_after is SlidingWindow.retryAfter, e into a window of length
-- len followed by one of next.
local function sw_retry_after(limit, len, next, prev, cur, cost, e)
  if cur + cost <= limit then
    local at, ok = sw_fits_at(limit, len, prev, cur, cost)
    if ok and at > e then
      return at - e
    end
  end
  local at, ok = sw_fits_at(limit, next, cur, 0, cost)
  if ok then
    return len - e + at
  end
  return len + next - e
end

local function sliding_window(key, now, limit, window, _, cost, _, _, mode)
  local start, prev, cur = 0, 0, 0
  local v = get(key)
  if v then
    local a, b, c = match(v, '^(%d+):(%d+):(%d+)$')
    start, prev, cur = tonumber(a), tonumber(b), tonumber(c)
    if not start or start > MAX or prev > MAX or cur > MAX then
      return BAD, 0, 0, 0
    end
  elseif v == false then
    return BAD, 0, 0, 0
  end
  local start0, prev0, cur0 = start, prev, cur
  -- roll
  local ws, we, wn = span(window, now)
  local ps -- the previous window's start
  if type(window) == 'table' then
    ps = window[1]
  else
    ps = ws - window
  end
  local len, next = we - ws, wn - we
  if ws <= start and (prev > 0 or cur > 0) then
    -- same window (or the clock stepped back): keep counting in it
    local e
    e, next = later(start, ws, we, wn)
    len = e - start
  elseif start == ps then
    start, prev, cur = ws, cur, 0
  else
    start, prev, cur = ws, 0, 0
  end
  local e = now - start
  local need = cost
  if mode == 1 then
    need = 1 -- a probe: would the smallest request fit
  elseif mode == 4 then
    cur = cur - cost -- a refund, never below 0, then a peek
    if cur < 0 then
      cur = 0
    end
    need = 0
  end
  local scaled = prev * sw_weight(len, e) + cur * 1000
  local allowed, retry, reset = 0, 0, 0
  if scaled + need * 1000 <= limit * 1000 then
    allowed = 1
  end
  if (allowed == 1 and mode ~= 4) or mode == 2 then
    local c = capped(cur, cost, 2 * limit)
    scaled = scaled + (c - cur) * 1000
    cur = c
  end
  if allowed == 0 then
    if mode == 2 then
      need = 1 -- the charge is taken: when would the next request pass
    end
    retry = sw_retry_after(limit, len, next, prev, cur, need, e)
  end
  local remaining = limit - ceil_div(scaled, 1000)
  if remaining < 0 then
    remaining = 0
  end
  if cur > 0 then
    reset = start + len + next - now
  elseif prev > 0 then
    reset = start + len - now
  end
  if (allowed == 1 or mode == 2 or mode == 4) and (start ~= start0 or prev ~= prev0 or cur ~= cur0) then
    if prev > 0 or cur > 0 then
      call('SET', key, fmt('%d:%d:%d', start, prev, cur), 'PX', px(reset))
    elseif prev0 > 0 or cur0 > 0 then
      call('DEL', key) -- both counts 0 behave as a missing key
    end
  end
  return allowed, remaining, retry, reset
end
