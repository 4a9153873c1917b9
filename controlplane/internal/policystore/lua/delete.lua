-- delete.lua: remove one domain's policy if the version guard holds.
-- KEYS[1] the store version counter, KEYS[2] the set of domain names,
-- KEYS[3] the domain's hash.
-- ARGV[1] domain, ARGV[2] expected version ("" = no guard), ARGV[3] change
-- channel, ARGV[4] "1" to take the domain over from the policy file that
-- owns it.
-- Returns {status, version[, owner]}: status 1 deleted (the new store
-- version), -1 no such domain, 0 guard failed (the domain's version), -3 a
-- policy file owns the domain (its version, and the file).
-- A store that is not initialized holds nothing.
local h = false
if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  h = redis.call('HMGET', KEYS[3], 'version', 'owner')
end
if not h or not h[1] then
  return {-1, 0}
end
local cur = h[1]
if h[2] and h[2] ~= '' and ARGV[4] ~= '1' then
  return {-3, tonumber(cur), h[2]}
end
if ARGV[2] ~= '' and ARGV[2] ~= cur then
  return {0, tonumber(cur)}
end
local v = redis.call('INCR', KEYS[1])
redis.call('DEL', KEYS[3])
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[3], v)
return {1, v}
