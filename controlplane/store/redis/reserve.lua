-- reserve.lua: algorithms.Reserve (Guava's reserve with a max wait), line by
-- line, on microseconds. State at key: the string "next:missing", next the
-- free ticket (when the next request may proceed) and missing the units
-- (1/period permit) missing from a full store at next.
-- A granted reservation writes the state at once, so the next caller, on any
-- replica, gets the following slot; a refused one writes nothing. A refund
-- (mode 4) moves the free ticket back by the time its cost takes to accrue
-- (rounded down), never before now, puts the rest back into the store,
-- never past full, and answers a peek.
--
-- Its answer differs in one place: an allowed request has no retry-after, so
-- the third value is the wait (microseconds) instead; a refused one answers
-- its retry-after there, as the other algorithms do (its wait is retry-after
-- plus max_wait).
local function reserve(key, now, rate, period, burst, cost, _, max_wait, mode)
  local next, missing = 0, 0
  local v = get(key)
  if v then
    next, missing = pair(v)
    if not next then
      return BAD, 0, 0, 0
    end
  elseif v == false then
    return BAD, 0, 0, 0
  end
  local next0, missing0 = next, missing
  if now > next then -- resync: permits stored while idle
    missing = refill(missing, rate, next, now)
    next = now
  end
  if mode == 4 then
    local units = cost * period
    local back = floor(units / rate)
    if back > next - now then
      back = next - now
    end
    next = next - back
    if next == now then
      missing = missing - (units - back * rate)
      if missing < 0 then
        missing = 0
      end
    end
    cost = 0
  end
  local capacity = burst * period
  local wait = next - now
  local allowed, third = 0, 0
  if wait <= max_wait then
    allowed = 1
  end
  if allowed == 1 or mode == 2 then
    local need = cost * period
    local spend = capacity - missing
    if need < spend then
      spend = need
    end
    missing = missing + spend
    local ahead = next
    next = next + ceil_div(need - spend, rate) -- the rest is paid by the next caller
    if mode == 2 then
      -- the debt ceiling: at most burst/rate periods ahead of now
      local ceiling = now + ceil_div(capacity, rate)
      if ahead > ceiling then
        ceiling = ahead
      end
      if next > ceiling then
        next = ceiling
      end
    end
  end
  if allowed == 1 then
    third = wait
  else
    third = next - now - max_wait -- a charge may have moved the free ticket
  end
  local remaining = 0
  if next <= now and capacity > missing then -- a lowered burst can leave missing > capacity
    remaining = floor((capacity - missing) / period)
  end
  local ahead = next - now
  if ahead < 0 then
    ahead = 0
  end
  local reset = ahead + ceil_div(missing, rate)
  if (allowed == 1 or mode == 2 or mode == 4) and (next ~= next0 or missing ~= missing0) then
    call('SET', key, fmt('%d:%d', next, missing), 'PX', px(reset))
  end
  return allowed, remaining, third, reset
end
