-- once_mark.lua: remembers store.Once tokens that a replica's memory store
-- applied, or learnt from Redis's answers, while it decided in Redis's
-- place (memory.Store.UnloadOnce, Store.MarkOnce). script.go joins it
-- after prelude.lua.
--
--   KEYS[i]     a token's dedupe key (onceKey: in its limit key's hash slot)
--   ARGV[1]     "" to read the clock from TIME, or the time in
--               microseconds (tests only)
--   ARGV[1+i]   how long token i has left, in microseconds
--
-- A dedupe key holds the time it is forgotten (see dispatch.lua's once);
-- one that holds a later time than this token's is kept. The reply is
-- the number of keys written.
local now = start(ARGV[1])
local set = 0
for i = 1, #KEYS do
  local left = tonumber(ARGV[1 + i])
  local seen = rpcall('GET', KEYS[i])
  if left > 0 and (type(seen) ~= 'string' or (tonumber(seen) or 0) < now + left) then
    call('SET', KEYS[i], fmt('%d', now + left), 'PX', fmt('%d', ceil_div(left, 1000) + pad))
    set = set + 1
  end
end
return { set }
