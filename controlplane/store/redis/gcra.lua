-- gcra.lua: algorithms.GCRA (redis-cell's CL.THROTTLE semantics), line by
-- line, on microseconds. State at key: the theoretical arrival time "tat".
-- Like the Go function, an allowed request or a charge writes the state
-- (unless nothing changed); a denied one writes nothing; a refund (mode 4)
-- moves the TAT back by its cost's emission intervals, never before now,
-- and answers a peek.
local function gcra(key, now, max_burst, count, period, cost, _, _, mode)
  local tat0 = 0
  local v = get(key)
  if v then
    tat0 = tonumber(match(v, '^(%d+)$'))
    if not tat0 or tat0 > MAX then
      return BAD, 0, 0, 0
    end
  elseif v == false then
    return BAD, 0, 0, 0
  end
  local limit = max_burst + 1
  local t = floor(period / count) -- the emission interval
  local dvt = t * limit
  local tat = tat0
  if tat < now then
    tat = now
  end
  local need = cost
  if mode == 1 then
    need = 1 -- a probe: would the smallest request fit
  elseif mode == 4 then
    tat = tat - t * cost -- a refund, never before now, then a peek
    if tat < now then
      tat = now
    end
    need, cost = 0, 0
  end
  local allowed, retry = 0, 0
  if tat + t * need - dvt <= now then
    allowed = 1
  end
  if allowed == 1 or mode == 2 then
    tat = now + capped(tat - now, t * cost, 2 * dvt)
  end
  local ttl = tat - now
  if allowed == 0 then
    if mode == 2 then
      need = 1 -- the charge is taken: when would the next request pass
    end
    retry = tat + t * need - dvt - now
  end
  local remaining = 0
  local spare = dvt - ttl
  if spare > 0 then
    remaining = floor(spare / t)
  end
  if (allowed == 1 or mode == 2 or mode == 4) and tat ~= tat0 then
    call('SET', key, fmt('%d', tat), 'PX', px(ttl))
  end
  return allowed, remaining, retry, ttl
end
