-- sliding_log.lua: algorithms.SlidingLog on microseconds (window a length,
-- or a calendar's periods: see prelude.lua's span). State at key: a
-- sorted set. Each instant with admitted requests is one member "at:cost"
-- scored at: requests of one instant merge, as the Go ring merges them, which
-- also keeps members unique. The member '#' scored -1-total carries the
-- running total so that counting is O(1); entry scores are >= 0, so '#'
-- always ranks first.
--
-- Like the Go function, every call drops the entries that have left the
-- window, whatever its outcome (a denied request takes nothing, but may clear
-- expired entries: were they kept, a window lengthened by a policy update
-- would count them again where Go has forgotten them). Only an admitted
-- request adds an entry and moves the expiry.
--
-- The Go ring keeps entries in arrival order, the set in time order; the two
-- agree while the clock does not step back. If it does, the set prunes every
-- entry older than the window where the ring stops at the first younger one.
-- Both keep at least every entry younger than the window as of the latest
-- time the log has seen, so no window ending at or after that time ever holds
-- more than limit.
--
-- Reads come first and writes last, so a BAD reply never follows a write
-- (but for a refund, which removes entries as it reads them).
--
-- A refund (mode 4) removes its cost from the newest entries (the last one
-- in part), then answers a peek.

-- sl_entry returns the arrival time and cost in an entry member, nil if it
-- does not parse. (Reading times from members spares Redis formatting scores.)
local function sl_entry(member)
  local at, c = match(member, '^(%d+):(%d+)$')
  return tonumber(at), tonumber(c)
end

-- sl_edge is SlidingLog.edge: entries at or before it have left the window.
local function sl_edge(window, now)
  if type(window) == 'table' then
    local gap = now - window[2]
    if gap > window[2] - window[1] - 1 then
      gap = window[2] - window[1] - 1
    end
    return window[1] + gap
  end
  return now - window
end

-- sl_leaves is SlidingLog.Leaves: when an entry of at leaves the window.
local function sl_leaves(window, at)
  if type(window) ~= 'table' then
    return at + window
  end
  local l
  if at < window[2] then
    l = window[2] + (at - window[1])
    if l > window[3] then
      l = window[3]
    end
  else
    l = window[3] + (at - window[2])
    if l > window[4] then
      l = window[4]
    end
  end
  return l
end

-- sl_arrival is SlidingLog.Arrival: the earliest arrival whose entry
-- leaves the window at leave or later.
local function sl_arrival(window, leave)
  if type(window) ~= 'table' then
    return leave - window
  end
  if leave < window[2] + (window[2] - window[1]) and leave <= window[3] then
    return window[1] + (leave - window[2])
  end
  local d = leave - window[3]
  if d < 0 then
    d = 0
  end
  return window[2] + d
end

-- sl_refund removes cost from the newest entries of key (total before it;
-- the entries that left the window were dropped already) and returns the
-- new total, or nil when an entry does not parse.
local function sl_refund(key, total, cost)
  local take = cost
  if take > total then
    take = total
  end
  local left = take
  while left > 0 do
    local tail = call('ZRANGE', key, -1, -1)[1]
    if not tail or tail == '#' then
      return nil -- the set holds less than its total says
    end
    local at, c = sl_entry(tail)
    if not c then
      return nil
    end
    call('ZREM', key, tail)
    if c > left then
      call('ZADD', key, fmt('%d', at), fmt('%d:%d', at, c - left))
      left = 0
    else
      left = left - c
    end
  end
  total = total - take
  if total == 0 then
    call('DEL', key)
  elseif take > 0 then
    call('ZADD', key, fmt('%d', -1 - total), '#')
  end
  return total
end

local function sliding_log(key, now, limit, window, _, cost, _, _, mode)
  local head = rpcall('ZRANGE', key, 0, 1, 'WITHSCORES')
  if head.err then
    return BAD, 0, 0, 0
  end
  local total, oldest = 0, nil
  if head[1] then
    if head[1] ~= '#' then
      return BAD, 0, 0, 0
    end
    total = -1 - tonumber(head[2])
    if head[4] then
      oldest = tonumber(head[4])
    end
  end
  -- Entries at or before the edge (now-window) have left the window.
  local edge = sl_edge(window, now)
  local pruned, npruned = false, 0
  if oldest and oldest <= edge then
    local gone = call('ZRANGEBYSCORE', key, 0, fmt('%d', edge))
    for i = 1, #gone do
      local _, c = sl_entry(gone[i])
      if not c then
        return BAD, 0, 0, 0
      end
      total = total - c
    end
    pruned, npruned = true, #gone
  end
  if not (total >= 0 and total <= MAX) then
    return BAD, 0, 0, 0
  end
  local allowed, retry, reset = 0, 0, 0
  local newest, add, same, merged, put_at
  local need = cost
  if mode == 1 then
    need = 1 -- a probe: would the smallest request fit
  elseif mode == 4 then
    -- a refund: writes first (the entries read so far parsed), then a peek
    if pruned then
      if total == 0 then
        call('DEL', key)
      else
        call('ZREMRANGEBYSCORE', key, 0, fmt('%d', edge))
        call('ZADD', key, fmt('%d', -1 - total), '#')
      end
      pruned = false
    end
    total = sl_refund(key, total, cost)
    if not total then
      return BAD, 0, 0, 0
    end
    need, cost = 0, 0
  end
  if total + need <= limit then
    allowed = 1
  end
  local take = 0
  if allowed == 1 or mode == 2 then
    take = capped(total, cost, 2 * limit) - total
  end
  if take > 0 then
    -- push: the new entry, merged with an entry of the same instant, or,
    -- when the log holds limit entries (only a charge past the limit finds
    -- it so), with the newest entry, at the later of the two times
    local full = false
    if mode == 2 and total >= limit then
      local n = call('ZCARD', key) - 1
      if pruned then
        n = n - npruned
      end
      full = n >= limit
    end
    add, newest, merged, put_at = true, now, take, now
    local tail = call('ZRANGE', key, -1, -1)[1]
    if tail and tail ~= '#' then
      local at = sl_entry(tail)
      if not at then
        return BAD, 0, 0, 0
      end
      if at == now or full then
        same = tail
        if at > now then
          newest, put_at = at, at
        end
      elseif at > now then
        newest = at
        same = call('ZRANGEBYSCORE', key, fmt('%d', now), fmt('%d', now))[1]
      end
    end
    if same then
      local _, c = sl_entry(same)
      if not c then
        return BAD, 0, 0, 0
      end
      merged = merged + c
    end
    total = total + take
  end
  if allowed == 0 then
    -- freedAt: the arrival of the entry whose expiry frees enough, the
    -- entry being pushed (the newest; same is merged into it) included
    if mode == 2 then
      need = 1 -- the charge is taken: when would the next request pass
    end
    local want = total + need - limit
    local lo = '0'
    if edge >= 0 then
      lo = '(' .. fmt('%d', edge)
    end
    local live = call('ZRANGEBYSCORE', key, lo, '+inf', 'LIMIT', 0, fmt('%d', want + 1))
    local freed, at = 0, nil
    for i = 1, #live do
      if live[i] ~= same then
        local t, c = sl_entry(live[i])
        if not c then
          return BAD, 0, 0, 0
        end
        freed = freed + c
        if freed >= want then
          at = t
          break
        end
      end
    end
    if not at and add then
      at = newest
    end
    if not at then
      return BAD, 0, 0, 0 -- the set holds less than its total says
    end
    retry = sl_leaves(window, at) - now
  end
  if total > 0 then
    if not newest then
      -- live entries remain, so the highest score is a live entry
      newest = sl_entry(call('ZRANGE', key, -1, -1)[1] or '')
      if not newest then
        return BAD, 0, 0, 0
      end
    end
    reset = sl_leaves(window, newest) - now
  end
  local remaining = limit - total
  if remaining < 0 then
    remaining = 0
  end
  -- writes
  if pruned then
    if total == 0 then
      call('DEL', key)
    else
      call('ZREMRANGEBYSCORE', key, 0, fmt('%d', edge))
    end
  end
  if add then
    if same then
      call('ZREM', key, same)
    end
    call('ZADD', key, fmt('%d', put_at), fmt('%d:%d', put_at, merged), fmt('%d', -1 - total), '#')
    call('PEXPIRE', key, px(reset))
  elseif pruned and total > 0 then
    -- the newest entry, hence the expiry, is unchanged
    call('ZADD', key, fmt('%d', -1 - total), '#')
  end
  return allowed, remaining, retry, reset
end
