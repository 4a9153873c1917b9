-- fixed_window.lua: algorithms.FixedWindow with Aligned set, line by line, on
-- microseconds. State at key: the string "start:count".
--
-- Like the Go function, an allowed request writes the state (unless nothing
-- changed); a denied one writes nothing. A state with count 0 behaves exactly
-- like a missing key, so it is deleted rather than written.
local function fixed_window(key, now, limit, window, _, cost)
  local start, count = 0, 0
  local v = get(key)
  if v then
    local a, b = match(v, '^(%d+):(%d+)$')
    start, count = tonumber(a), tonumber(b)
    if not start or start > MAX or count > MAX then
      return BAD, 0, 0, 0
    end
  elseif v == false then
    return BAD, 0, 0, 0
  end
  local start0, count0 = start, count
  local ws = now - now % window
  if ws > start or count == 0 then
    start, count = ws, 0
  end
  local e = start + window
  local allowed, retry, reset = 0, 0, 0
  if count + cost <= limit then
    count = count + cost
    allowed = 1
  else
    retry = e - now
  end
  local remaining = limit - count
  if remaining < 0 then
    remaining = 0
  end
  if count > 0 then
    reset = e - now
  end
  if allowed == 1 and (start ~= start0 or count ~= count0) then
    if count > 0 then
      call('SET', key, fmt('%d:%d', start, count), 'PX', px(reset))
    elseif count0 > 0 then
      call('DEL', key) -- count 0 means no window, as a missing key does
    end
  end
  return allowed, remaining, retry, reset
end
