-- token_bucket.lua: algorithms.TokenBucket, line by line, on microseconds.
-- State at key: the string "last:used", used in units of 1/period token.
-- Like the Go function, an allowed request or a charge writes the state
-- (unless nothing changed); a denied one writes nothing; a refund (mode 4)
-- puts its cost back, never past a full bucket, and answers a peek.
local function token_bucket(key, now, rate, period, burst, cost, _, _, mode)
  local last, used = 0, 0
  local v = get(key)
  if v then
    last, used = pair(v)
    if not last then
      return BAD, 0, 0, 0
    end
  elseif v == false then
    return BAD, 0, 0, 0
  end
  local last0, used0 = last, used
  used = refill(used, rate, last, now) -- usedAt
  local capacity = burst * period
  local need = cost
  if mode == 1 then
    need = 1 -- a probe: would the smallest request fit
  elseif mode == 4 then
    used = used - cost * period -- a refund, never past full, then a peek
    if used < 0 then
      used = 0
    end
    if now > last then
      last = now
    end
    need, cost = 0, 0
  end
  local allowed, retry = 0, 0
  if used + need * period <= capacity then
    allowed = 1
  end
  if allowed == 1 or mode == 2 then
    used = capped(used, cost * period, 2 * capacity)
    if now > last then
      last = now
    end
  end
  if allowed == 0 then
    if mode == 2 then
      need = 1 -- the charge is taken: when would the next request pass
    end
    retry = ceil_div(used + need * period - capacity, rate)
  end
  -- A burst lowered under existing state can leave used above capacity:
  -- remaining is then 0, never negative.
  local remaining = 0
  if capacity > used then
    remaining = floor((capacity - used) / period)
  end
  local reset = ceil_div(used, rate)
  if (allowed == 1 or mode == 2 or mode == 4) and (used ~= used0 or last ~= last0) then
    call('SET', key, fmt('%d:%d', last, used), 'PX', px(reset))
  end
  return allowed, remaining, retry, reset
end
