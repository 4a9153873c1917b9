-- carry.lua: adds what a replica's memory store admitted while Redis could
-- not decide to the state here (store.Carry; Store.Carry calls it once a
-- degraded replica is back). script.go joins it after prelude.lua and
-- fixed_window.lua, whose helpers it uses.
--
--   KEYS[i]            the key
--   ARGV[1]            "" to read the clock from TIME, or the time in
--                      microseconds (tests only)
--   ARGV[2+15(i-1) ..] key i: algorithm (plus 100 for a calendar limit),
--                      three limit parameters (as dispatch.lua takes them),
--                      left (reserve: its max_wait), base, used, base_prev,
--                      used_prev (see below; microseconds), and six period
--                      boundaries for a calendar limit (else zeros; see
--                      prelude.lua's periods)
--
-- The replica's clock is not this one (it may be skewed by any amount), so
-- it sends durations from the moment it took the carry, never instants:
-- left is how long until its window ends (fixed_window, sliding_window) or
-- until its newest entry leaves the window (sliding_log); this script adds
-- it to its own now. The replica took the carry a little before this runs:
-- a state counted from then lasts that much longer, never less.
--
-- Every amount merges alike: the state keeps the larger of its own amount
-- and the base the replica was seeded with (so a Redis that lost its data
-- gets it back, and one that kept it counts it once), adds what the replica
-- admitted beyond the base, and never holds more than a full limiter. An
-- amount at or above a full limiter is left as it is.
--
-- The reply holds one integer per key: 1 written, 0 nothing to do (the
-- window is over, or nothing changes), BAD (a state sluice did not write).
local now = start(ARGV[1])

-- merge returns the amount a state holding r keeps after a replica's base
-- b and used u, with cap a full limiter.
local function merge(r, b, u, cap)
  local m = r
  if b > m then
    m = b
  end
  m = m + u - b
  if m > cap then
    m = cap
  end
  if m < r then
    m = r
  end
  return m
end

-- window_of returns the start of the window here that a replica's window
-- ending left from now stands for: the one whose end is nearest, but never
-- a window after the current one (what the replica admitted lies in the
-- past). A replica seeded from this store's answers shifted its windows
-- onto these (memory's Seed), so its window ends at this current window's
-- end, or just after the previous one's when the seed came a trip late:
-- both are matched. Others match when the clocks are less than half a
-- window apart.
local function window_of(window, left)
  local ws, we = span(window, now)
  if 2 * (now + left - ws) >= we - ws then
    return ws, we
  end
  if type(window) == 'table' then
    return window[1], ws
  end
  return ws - window, ws
end

-- fixed_window: the count of the replica's window merges into the window
-- it stands for, if that is the current one.
local function carry_fw(key, limit, window, left, b, u)
  local start, e = window_of(window, left)
  if e <= now then
    return 0
  end
  local s, count = fw_state(key, nil)
  if not s then
    return BAD
  end
  local r = 0
  if s == start then
    r = count
  elseif s > start and count > 0 then
    return 0 -- Redis counts a later window already
  end
  local n = merge(r, b, u, limit)
  if n == r then
    return 0
  end
  call('DEL', key)
  call('HSET', key, fmt('%d:%d', start, e - start), fmt('%d', n))
  call('PEXPIRE', key, px(e - now))
  return 1
end

-- sliding_window: both windows' counts merge, once the replica's and the
-- state here are rolled to the same window (the replica's current window
-- stands for one here as for fixed_window).
local function carry_sw(key, limit, window, left, b, u, bp, up)
  local start, e = window_of(window, left)
  local ws, we, wn = span(window, now)
  if ws == e then
    b, u, bp, up, start = 0, 0, b, u, ws
  elseif ws > start then
    return 0
  end
  local ps = ws - (we - ws) -- the previous window's start
  if type(window) == 'table' then
    ps = window[1]
  end
  local rs, rp, rc = 0, 0, 0
  local v = get(key)
  if v then
    local a, x, y = match(v, '^(%d+):(%d+):(%d+)$')
    rs, rp, rc = tonumber(a), tonumber(x), tonumber(y)
    if not rs or rs > MAX or rp > MAX or rc > MAX then
      return BAD
    end
  elseif v == false then
    return BAD
  end
  if rs == start then
    -- the same window
  elseif rs == ps then
    rp, rc = rc, 0
  elseif rs > start and (rp > 0 or rc > 0) then
    return 0 -- Redis counts a later window already
  else
    rp, rc = 0, 0
  end
  local np, nc = merge(rp, bp, up, limit), merge(rc, b, u, limit)
  if np == rp and nc == rc and rs == start then
    return 0
  end
  local reset = we - now
  if nc > 0 then
    reset = wn - now
  end
  call('SET', key, fmt('%d:%d:%d', start, np, nc), 'PX', px(reset))
  return 1
end

-- sliding_log: the replica's entries arrive as one entry as old as its
-- newest entry (which leaves the window left from now); the log's total
-- merges.
local function carry_sl(key, limit, window, left, b, u)
  local at = sl_arrival(window, now + left)
  if left <= 0 or at < 0 then
    return 0
  end
  if at > now then
    at = now
  end
  -- a peek prunes what left the window and checks the state
  local ok = sliding_log(key, now, limit, window, 0, 0, '0')
  if ok == BAD then
    return BAD
  end
  local total = 0
  local head = call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if head[1] then
    total = -1 - tonumber(head[2])
  end
  local add = merge(total, b, u, limit) - total
  if add <= 0 then
    return 0
  end
  local same = call('ZRANGEBYSCORE', key, fmt('%d', at), fmt('%d', at))[1]
  local merged = add
  if same then
    local _, c = sl_entry(same)
    if not c then
      return BAD
    end
    merged = merged + c
    call('ZREM', key, same)
  end
  total = total + add
  call('ZADD', key, fmt('%d', at), fmt('%d:%d', at, merged), fmt('%d', -1 - total), '#')
  local newest = sl_entry(call('ZRANGE', key, -1, -1)[1])
  call('PEXPIRE', key, px(sl_leaves(window, newest) - now))
  return 1
end

-- token_bucket: the units missing from a full bucket, refilled to now,
-- merge.
local function carry_tb(key, rate, period, burst, b, u)
  local last, used = 0, 0
  local v = get(key)
  if v then
    last, used = pair(v)
    if not last then
      return BAD
    end
  elseif v == false then
    return BAD
  end
  used = refill(used, rate, last, now)
  local n = merge(used, b, u, burst * period)
  if n == used then
    return 0
  end
  if now > last then
    last = now
  end
  call('SET', key, fmt('%d:%d', last, n), 'PX', px(ceil_div(n, rate)))
  return 1
end

-- gcra: the time the TAT is ahead of now merges.
local function carry_gcra(key, max_burst, count, period, b, u)
  local tat = 0
  local v = get(key)
  if v then
    tat = tonumber(match(v, '^(%d+)$'))
    if not tat or tat > MAX then
      return BAD
    end
  elseif v == false then
    return BAD
  end
  local owed = 0
  if tat > now then
    owed = tat - now
  end
  local n = merge(owed, b, u, floor(period / count) * (max_burst + 1))
  if n == owed then
    return 0
  end
  call('SET', key, fmt('%d', now + n), 'PX', px(n))
  return 1
end

-- reserve: what the limiter owes, in time (until its free ticket, then
-- until the store is full: reserve.lua's reset), merges; capped at what a
-- reserve can owe (two full stores and max_wait). The state built from it
-- owes no less (memory's reserveFromOwed builds the same).
local function carry_rs(key, rate, period, burst, max_wait, b, u)
  local next, missing = 0, 0
  local v = get(key)
  if v then
    next, missing = pair(v)
    if not next then
      return BAD
    end
  elseif v == false then
    return BAD
  end
  if now > next then
    missing = refill(missing, rate, next, now)
    next = now
  end
  local owed = next - now + ceil_div(missing, rate)
  local capacity = burst * period
  local full = ceil_div(capacity, rate)
  local n = merge(owed, b, u, 2 * full + max_wait)
  if n == owed then
    return 0
  end
  if n <= floor(capacity / rate) then
    next, missing = now, n * rate
  else
    next, missing = now + n - full, capacity
    if next < now then
      next = now
    end
  end
  call('SET', key, fmt('%d:%d', next, missing), 'PX', px(n))
  return 1
end

local out = {}
local j = 2
for i = 1, #KEYS do
  local alg = tonumber(ARGV[j])
  local p1, p2, p3 = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3])
  local left, b, u = tonumber(ARGV[j + 4]), tonumber(ARGV[j + 5]), tonumber(ARGV[j + 6])
  local bp, up = tonumber(ARGV[j + 7]), tonumber(ARGV[j + 8])
  local k = KEYS[i]
  local r = BAD
  if alg >= 100 then
    alg = alg - 100
    p2 = periods(now, tonumber(ARGV[j + 9]), tonumber(ARGV[j + 10]), tonumber(ARGV[j + 11]), tonumber(ARGV[j + 12]),
      tonumber(ARGV[j + 13]), tonumber(ARGV[j + 14]))
    if not p2 then
      alg, r = 0, CLOCK
    end
  end
  if alg == 1 then
    r = carry_fw(k, p1, p2, left, b, u)
  elseif alg == 2 then
    r = carry_sw(k, p1, p2, left, b, u, bp, up)
  elseif alg == 3 then
    r = carry_sl(k, p1, p2, left, b, u)
  elseif alg == 4 then
    r = carry_tb(k, p1, p2, p3, b, u)
  elseif alg == 5 then
    r = carry_gcra(k, p1, p2, p3, b, u)
  elseif alg == 6 then
    r = carry_rs(k, p1, p2, p3, left, b, u)
  end
  out[i] = r
  j = j + 15
end
return out
