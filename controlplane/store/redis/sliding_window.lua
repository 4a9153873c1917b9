-- sliding_window.lua: algorithms.SlidingWindow, line by line, on
-- microseconds. State at key: the string "start:prev:cur".
-- Like the Go function, an allowed request or a charge writes the state
-- (unless nothing changed); a denied one writes nothing. A state with both counts 0 behaves
-- exactly like a missing key, so it is deleted rather than written.

-- sw_weight is SlidingWindow.weight: the previous window's weight in
-- thousandths, e elapsed into the current window.
local function sw_weight(window, e)
  if e >= window then
    return 0
  end
  if e < 0 then
    e = 0
  end
  return floor((window - e) * 1000 / window)
end

-- sw_fits_at is SlidingWindow.fitsAt. room is never negative where it is
-- called, so floor matches Go's truncating division.
local function sw_fits_at(limit, window, prev, cur, cost)
  local room = (limit - cur - cost) * 1000
  if prev == 0 then
    return 0, room >= 0
  end
  local q = floor(room / prev)
  if q >= 1000 then
    return 0, true
  end
  local at = window - ceil_div((q + 1) * window, 1000) + 1
  if at < 0 then
    at = 0
  end
  return at, at < window
end

-- sw_retry_after is SlidingWindow.retryAfter.
local function sw_retry_after(limit, window, prev, cur, cost, e)
  if cur + cost <= limit then
    local at, ok = sw_fits_at(limit, window, prev, cur, cost)
    if ok and at > e then
      return at - e
    end
  end
  local at, ok = sw_fits_at(limit, window, cur, 0, cost)
  if ok then
    return window - e + at
  end
  return 2 * window - e
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
  local ws = now - now % window
  if ws <= start and (prev > 0 or cur > 0) then
    -- same window (or the clock stepped back): keep counting in it
  elseif ws == start + window then
    start, prev, cur = ws, cur, 0
  else
    start, prev, cur = ws, 0, 0
  end
  local e = now - start
  local scaled = prev * sw_weight(window, e) + cur * 1000
  local allowed, retry, reset = 0, 0, 0
  local need = cost
  if mode == 1 then
    need = 1 -- a probe: would the smallest request fit
  end
  if scaled + need * 1000 <= limit * 1000 then
    allowed = 1
  end
  if allowed == 1 or mode == 2 then
    local c = capped(cur, cost, 2 * limit)
    scaled = scaled + (c - cur) * 1000
    cur = c
  end
  if allowed == 0 then
    if mode == 2 then
      need = 1 -- the charge is taken: when would the next request pass
    end
    retry = sw_retry_after(limit, window, prev, cur, need, e)
  end
  local remaining = limit - ceil_div(scaled, 1000)
  if remaining < 0 then
    remaining = 0
  end
  if cur > 0 then
    reset = start + 2 * window - now
  elseif prev > 0 then
    reset = start + window - now
  end
  if (allowed == 1 or mode == 2) and (start ~= start0 or prev ~= prev0 or cur ~= cur0) then
    if prev > 0 or cur > 0 then
      call('SET', key, fmt('%d:%d:%d', start, prev, cur), 'PX', px(reset))
    elseif prev0 > 0 or cur0 > 0 then
      call('DEL', key) -- both counts 0 behave as a missing key
    end
  end
  return allowed, remaining, retry, reset
end
