-- gcra.lua: algorithms.GCRA (redis-cell's CL.THROTTLE semantics), line by
-- line, on microseconds. State at key: the theoretical arrival time "tat".
-- Like the Go function, an allowed request writes the state (unless nothing
-- changed); a denied one writes nothing.
local function gcra(key, now, max_burst, count, period, cost)
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
  local new_tat = tat + t * cost
  local diff = now - (new_tat - dvt)
  local allowed, retry, ttl = 0, 0, 0
  if diff < 0 then
    retry = -diff
    ttl = tat - now
  else
    allowed = 1
    ttl = new_tat - now
  end
  local remaining = 0
  local spare = dvt - ttl
  if spare > 0 then
    remaining = floor(spare / t)
  end
  if allowed == 1 and new_tat ~= tat0 then
    call('SET', key, fmt('%d', new_tat), 'PX', px(ttl))
  end
  return allowed, remaining, retry, ttl
end
