-- lease.lua: debits up to k units of one key's limit in one call and grants
-- them to the caller, who then admits that many requests without asking
-- Redis (controlplane/internal/lease). script.go joins it after prelude.lua and the
-- four algorithm files it calls; sliding_log is never leased.
--
--   KEYS[2i-1], KEYS[2i]  key i and its lease mark (see below)
--   ARGV[1]            "" to read the clock from TIME, or the time in
--                      microseconds (tests only)
--   ARGV[2+12(i-1) ..] key i: algorithm (plus 100 for a calendar limit),
--                      three limit parameters (as dispatch.lua takes them),
--                      k (the units wanted, >= 1), the longest validity in
--                      microseconds (> 0), and six period boundaries for a
--                      calendar limit (else zeros; see prelude.lua's
--                      periods)
--
-- A lease is the algorithm's own decision of cost g = min(k, remaining),
-- where remaining is what a peek at now answers, so a lease of g and g
-- local admissions leave the state exactly as g admissions would:
--
--   fixed_window, sliding_window: g admissions at now, valid until the
--     current window ends: spent within it, they are counted in the window
--     they happen in, as a per-request decision would count them.
--   token_bucket, gcra: valid for v (see lease_validity: at most half
--     the capacity's worth of emission intervals, or g of them).
--     In GCRA's terms (a token bucket is the same limiter):
--     the condition is checked at now (the earliest the units can be spent)
--     and the state written as g admissions at now + v (the latest; for
--     token_bucket see tb_lease), with the expiry pushed back by v:
--     whenever within [now, now + v] the units
--     are spent, the state is at least as full as per-request decisions
--     would have left it. The price is the refill during v that the bucket
--     could have used: the state's time stays at least now + v, so while
--     leases keep coming a key holds back at most v's worth of refill (half
--     its capacity), once, not per lease. Until now + v no
--     request refills
--     anything from this state (its time lies ahead), which is also what
--     makes return.lua exact.
--
-- The mark (a string: microseconds) is the latest time a token_bucket or
-- gcra lease wrote the state as of. return.lua gives units back only while
-- no lease has written a later time than the returning lease's end, since
-- such a lease may have refilled the units already (gcra's state alone
-- cannot tell).
--
-- The reply holds six integers per key: granted g (0: none, the key is at
-- its limit; BAD: a state sluice did not write), remaining after the
-- debit, retry-after when g is 0, reset-after (until the limiter is full
-- again), the validity in microseconds, and the lease's end on Redis's
-- clock (microseconds, for return.lua).
local now = start(ARGV[1])
fw_fields = {}

-- lease_validity is how long a lease of g units may be spent: until the
-- current window ends (fixed_window, sliding_window); for token_bucket and
-- gcra, longest, but no longer than the larger of g emission intervals and
-- half the capacity's worth of them (the refill a lease forgoes is
-- at most its validity's worth: see above).
local function lease_validity(alg, p1, p2, p3, g, longest)
  local v
  if alg == 1 or alg == 2 then
    local _, we = span(p2, now)
    v = we - now
  else
    local t, cap -- the emission interval, the capacity
    if alg == 4 then
      t, cap = p2 / p1, p3 -- rate p1 per p2, burst p3
    else
      t, cap = floor(p3 / p2), p1 + 1 -- count p2 per p3, max_burst p1
    end
    v = floor(t * g)
    local q = floor(t * cap / 2)
    if q > v then
      v = q
    end
  end
  if v > longest then
    v = longest
  end
  if v < 1 then
    v = 1
  end
  return v
end

-- tb_lease writes a token bucket lease of g units valid for v: the state
-- as GCRA's would be after g admissions at now + v (see above), kept at
-- time now. In GCRA's terms the bucket is full again at now + used/rate;
-- that time becomes max(it, now + v) + g tokens. A state written as of a
-- later time instead (as gcra.lua's is) would not do for a token bucket:
-- a request before that time refills nothing but is not charged the
-- refill either, which admits too much. Here used can exceed the capacity
-- (by at most v's refill): the bucket then refuses until it has refilled
-- that much, as the script already does for a burst lowered under a state.
-- It returns remaining and reset-after.
local function tb_lease(key, now, rate, period, burst, g, v)
  local last, used = 0, 0
  local s = get(key)
  if s then
    last, used = pair(s) -- the peek before it checked the state
  end
  used = refill(used, rate, last, now)
  if now > last then
    last = now
  end
  if used < v * rate then
    used = v * rate
  end
  used = used + g * period
  local reset = ceil_div(used, rate)
  call('SET', key, fmt('%d:%d', last, used), 'PX', px(reset))
  local remaining = 0
  if burst * period > used then
    remaining = floor((burst * period - used) / period)
  end
  return remaining, reset
end

-- lease decides one key: granted, remaining, retry, reset, validity.
local function lease(key, mark, alg, p1, p2, p3, k, longest)
  if alg == CLOCK then
    return CLOCK, 0, 0, 0, 0
  end
  local f = ({ fixed_window, sliding_window, nil, token_bucket, gcra })[alg]
  if not f then
    return BAD, 0, 0, 0, 0
  end
  local ok, remaining, retry = f(key, now, p1, p2, p3, 0, '0')
  if ok == BAD then
    return BAD, 0, 0, 0, 0
  end
  local g = k
  if remaining < g then
    g = remaining
  end
  if g < 1 then
    -- The peek's remaining is exact (a request of one fits exactly when it
    -- is at least 1), but it carries no retry-after: ask for one unit,
    -- which a full limiter refuses without writing anything.
    local reset
    ok, remaining, retry, reset = f(key, now, p1, p2, p3, 1, '1')
    if ok ~= 1 then
      return 0, 0, retry, reset, 0
    end
    return 1, remaining, 0, reset, 1 -- admitted at now: spend it at once
  end
  local v = lease_validity(alg, p1, p2, p3, g, longest)
  local reset, skip
  if alg == 4 then
    remaining, reset = tb_lease(key, now, p1, p2, p3, g, v)
  else
    local at, pad0 = now, pad
    if alg == 5 then
      at = now + v
      pad = pad + ceil_div(v, 1000)
    end
    ok, remaining, skip, reset = f(key, at, p1, p2, p3, g, fmt('%d', g))
    pad = pad0
    if ok ~= 1 then
      return BAD, 0, 0, 0, 0 -- cannot happen: the peek said g fits
    end
    if at > now then
      -- remaining and reset-after as of now, not as of now + v
      skip, remaining, skip, reset = f(key, now, p1, p2, p3, 0, '0')
    end
  end
  if alg >= 4 then
    local m = get(mark)
    if m == false or not m or (tonumber(m) or 0) < now + v then
      call('SET', mark, fmt('%d', now + v), 'PX', px(v))
    end
  end
  return g, remaining, 0, reset, v
end

local out, j = {}, 2
for i = 1, #KEYS / 2 do
  local alg, p2 = tonumber(ARGV[j]), tonumber(ARGV[j + 2])
  if alg >= 100 then
    alg = alg - 100
    p2 = periods(now, tonumber(ARGV[j + 6]), tonumber(ARGV[j + 7]), tonumber(ARGV[j + 8]), tonumber(ARGV[j + 9]),
      tonumber(ARGV[j + 10]), tonumber(ARGV[j + 11]))
    if not p2 then
      alg = CLOCK
    end
  end
  local g, remaining, retry, reset, v = lease(KEYS[2 * i - 1], KEYS[2 * i], alg, tonumber(ARGV[j + 1]), p2,
    tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4]), tonumber(ARGV[j + 5]))
  local o = 6 * (i - 1)
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = g, remaining, retry, reset, v, now + v
  j = j + 12
end
return out
