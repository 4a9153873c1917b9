-- fixed_window.lua: algorithms.FixedWindow with Aligned set (or with a
-- calendar's Periods, when window is a table: see prelude.lua's span), on
-- microseconds.
--
-- State at key: a hash holding one field, "start:window", whose value is the
-- count of the window that starts at start (window is the length of that
-- window when the field was made). sluice before 2026-11 kept the string
-- "start:count"; such a state is read, and replaced by the hash on the next
-- allowed request.
--
-- The common request (the key's field is the current window's) is one
-- HINCRBY: the field existed, so it is the state, and the new count decides.
-- The first request of a window on a key that holds nothing else (the
-- HINCRBY made the field, HLEN finds it alone) needs only its expiry set.
-- A denied request takes its cost back at once (HINCRBY -cost): the state is
-- as it was, byte for byte, and keeps its expiry. Anything else (a new
-- window, a clock that stepped back, a limit whose window changed, a peek,
-- the old string state) goes through fw_slow, a line-by-line port of the Go
-- function on the state read whole. A state with count 0 behaves exactly
-- like a missing key, so it is deleted rather than written.
--
-- The write that makes a field sets the expiry (the end of the window); the
-- HINCRBYs of the same window keep it. A field per window length means a
-- limit changed to another window under a live state gets its expiry moved.
--
-- A refund (mode 4) takes its cost off the count of the current window,
-- never below 0, and answers a peek.

-- fw_fields maps a window length (or a calendar's periods) to the name of
-- the current window's field, for this script call (whose clock does not
-- move).
local fw_fields = {}

-- fw_state reads key's state, leaving out field skip (the field the caller
-- just made): start, count, the field that holds them (nil if none) and
-- whether the key holds the old string state. It returns nil when the key
-- holds something sluice did not write.
local function fw_state(key, skip)
  local h = rpcall('HGETALL', key)
  if h.err then
    local v = get(key)
    if not v then
      return nil -- neither a hash nor a string
    end
    local start, count = pair(v)
    if not start then
      return nil
    end
    return start, count, nil, true
  end
  local start, count, field = 0, 0, nil
  for i = 1, #h, 2 do
    local f, c = h[i], h[i + 1]
    if f ~= skip then
      if field then
        return nil -- sluice keeps one field
      end
      local s = tonumber(match(f, '^(%d+):%d+$'))
      local n = tonumber(match(c, '^(%d+)$'))
      if not s or not n or s > MAX or n > MAX then
        return nil
      end
      start, count, field = s, n, f
    end
  end
  return start, count, field, false
end

-- fw_slow decides on the state read whole. added says the caller's HINCRBY
-- just made field (the current window's, [ws, we), followed by one that
-- ends at wn) with cost in it: fw_slow takes it back unless the new state
-- is exactly that.
local function fw_slow(key, now, limit, ws, we, wn, cost, field, added, mode)
  local skip = nil
  if added then
    skip = field
  end
  local start, count, old, legacy = fw_state(key, skip)
  if not start then
    if added then
      call('HDEL', key, field)
    end
    return BAD, 0, 0, 0
  end
  local start0, count0 = start, count
  if ws > start or count == 0 then
    start, count = ws, 0
  end
  local e = later(start, ws, we, wn)
  local allowed, retry = 0, 0
  local need = cost
  if mode == 1 then
    need = 1 -- a probe: would the smallest request fit
  elseif mode == 4 then
    count = count - cost -- a refund, never below 0, then a peek
    if count <= 0 then
      count = 0
      start, e = ws, we -- an empty window is the current one
    end
    need = 0
  end
  if count + need <= limit then
    allowed = 1
  end
  if (allowed == 1 and mode ~= 4) or mode == 2 then
    count = capped(count, cost, 2 * limit)
  end
  if allowed == 0 then
    retry = e - now
  end
  local remaining = limit - count
  if remaining < 0 then
    remaining = 0
  end
  local reset = e - now -- until the window ends, counted in or not
  if (allowed == 0 and mode ~= 2 and mode ~= 4) or (start == start0 and count == count0) then
    -- nothing changes (a denial, a peek or probe in the same window, or a
    -- charge at the debt ceiling)
    if added then
      call('HDEL', key, field)
    end
    return allowed, remaining, retry, reset
  end
  if count == 0 then
    -- a peek that moved to a new window: no state
    if count0 > 0 then
      call('DEL', key)
    end
    return allowed, remaining, retry, reset
  end
  local want = field
  if start ~= ws then
    want = fmt('%d:%d', start, e - start)
  end
  if legacy then
    call('DEL', key)
  elseif old and old ~= want then
    call('HDEL', key, old)
  end
  if added and want ~= field then
    call('HDEL', key, field)
  end
  if not (added and want == field and count == cost) then
    call('HSET', key, want, fmt('%d', count))
  end
  call('PEXPIRE', key, px(reset))
  return allowed, remaining, retry, reset
end

-- fw_field returns the name of the field of the window [ws, we) (the
-- current one of window: the clock does not move during a call).
local function fw_field(window, ws, we)
  local field = fw_fields[window]
  if not field then
    field = fmt('%d:%d', ws, we - ws)
    fw_fields[window] = field
  end
  return field
end

-- fw_counted decides a request of cost > 0 after HINCRBY key field cost
-- answered n (a number, or an error table when the key is not a hash or the
-- field not an integer).
local function fw_counted(key, now, limit, ws, we, wn, cost, cost_text, field, n)
  if type(n) ~= 'number' then
    -- not a hash (the old string state, or something else), or the field
    -- is not an integer: nothing was written
    return fw_slow(key, now, limit, ws, we, wn, cost, field, false, 0)
  end
  if n <= cost or n > MAX then
    -- a new field (or one holding nonsense): decide on the whole state
    if n ~= cost then
      call('HINCRBY', key, field, '-' .. cost_text)
      return BAD, 0, 0, 0
    end
    if cost <= limit and call('HLEN', key) == 1 then
      -- The field is the key's only one: the state is this window's with
      -- cost in it, exactly what fw_slow would decide on an empty state,
      -- without reading it back. Most keys of a spread load start here.
      call('PEXPIRE', key, px(we - now))
      return 1, limit - cost, 0, we - now
    end
    return fw_slow(key, now, limit, ws, we, wn, cost, field, true, 0)
  end
  -- The field held n - cost > 0: it is the state, this window's.
  local e = we
  if n <= limit then
    return 1, limit - n, 0, e - now
  end
  call('HINCRBY', key, field, '-' .. cost_text)
  local remaining = limit - (n - cost)
  if remaining < 0 then
    remaining = 0
  end
  return 0, remaining, e - now, e - now
end

local function fixed_window(key, now, limit, window, _, cost, cost_text, _, mode)
  local ws, we, wn = span(window, now)
  local field = fw_field(window, ws, we)
  if cost == 0 or (mode and mode ~= 0) then -- lease.lua calls without a mode
    return fw_slow(key, now, limit, ws, we, wn, cost, field, false, mode)
  end
  return fw_counted(key, now, limit, ws, we, wn, cost, cost_text, field, rpcall('HINCRBY', key, field, cost_text))
end
