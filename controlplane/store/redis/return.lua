-- return.lua: gives back the unspent units of token_bucket and gcra leases
-- (see lease.lua), so that a lease taken for a burst that did not come does
-- not hold capacity until the refill catches up. script.go joins it after
-- prelude.lua.
--
--   KEYS[2i-1], KEYS[2i]  key i and its lease mark (see lease.lua)
--   ARGV[1]            "" to read the clock from TIME, or the time in
--                      microseconds (tests only)
--   ARGV[2+6(i-1) ..]  key i: algorithm (4 token_bucket, 5 gcra), three
--                      limit parameters (as dispatch.lua takes them), the
--                      units to return, the lease's end (lease.lua's fifth
--                      reply value)
--
-- Exact only before the lease's end, and only while no later lease wrote
-- the state as of a time beyond that end (the mark): until then the state's
-- time lies at or beyond the end (lease.lua wrote it as of then), no request
-- has refilled anything from it, and the lease's units are all still in it;
-- subtracting them leaves the state exactly as a lease of fewer units would
-- have. Otherwise the refill may already have absorbed them, and taking
-- them out again could give away units that later requests were charged
-- for: such a return does nothing. The caller must have stopped spending
-- the lease.
--
-- The reply holds one integer per key: 1 returned, 0 nothing done (the
-- lease had ended, nothing to return, or the key is gone), BAD (a state
-- sluice did not write).
local now = start(ARGV[1])

-- give_back returns units u of a lease that ends at e to key.
local function give_back(key, mark, alg, p1, p2, p3, u, e)
  if now >= e or u < 1 or (alg ~= 4 and alg ~= 5) then
    return 0
  end
  local m = get(mark)
  if not m or (tonumber(m) or e + 1) > e then
    return 0 -- a later lease (or no mark: do nothing)
  end
  local v = get(key)
  if v == nil then
    return 0
  elseif v == false then
    return BAD
  end
  if alg == 4 then
    local last, used = pair(v)
    if not last then
      return BAD
    end
    used = used - u * p2 -- a token is p2 (period) units
    if used <= 0 then
      call('DEL', key) -- a full bucket: as if the key were missing
    else
      call('SET', key, fmt('%d:%d', last, used), 'KEEPTTL')
    end
    return 1
  end
  local tat = tonumber(match(v, '^(%d+)$'))
  if not tat or tat > MAX then
    return BAD
  end
  tat = tat - u * floor(p3 / p2) -- u emission intervals
  if tat <= now then
    call('DEL', key) -- a TAT in the past: as if the key were missing
  else
    call('SET', key, fmt('%d', tat), 'KEEPTTL')
  end
  return 1
end

local out, j = {}, 2
for i = 1, #KEYS / 2 do
  out[i] = give_back(KEYS[2 * i - 1], KEYS[2 * i], tonumber(ARGV[j]), tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]),
    tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4]), tonumber(ARGV[j + 5]))
  j = j + 6
end
return out
