-- put.lua: store one domain's policy if the version guard holds.
-- KEYS[1] the store version counter, KEYS[2] the set of domain names,
-- KEYS[3] the domain's hash {version, yaml[, owner, source]}.
-- ARGV[1] domain, ARGV[2] yaml, ARGV[3] expected version ("" = no guard),
-- ARGV[4] change channel, ARGV[5] "1" to take the domain over from the
-- policy file that owns it.
-- Returns {status, version[, owner]}: status 1 written (version = the new
-- store version), 2 unchanged (byte-identical; the domain's version), 0
-- guard failed (the domain's version, 0 when absent), -2 the store is not
-- initialized (no version counter: new or lost; Init it first), -3 a policy
-- file owns the domain (its version, and the file).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {-2, 0}
end
-- The set of names is the truth: a hash left over without its name (a
-- partly lost store) counts as absent and is overwritten.
local cur = '0'
local owner = false
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  local h = redis.call('HMGET', KEYS[3], 'version', 'owner')
  cur = h[1] or '0'
  owner = h[2]
end
if owner and owner ~= '' and ARGV[5] ~= '1' then
  return {-3, tonumber(cur), owner}
end
if ARGV[3] ~= '' and ARGV[3] ~= cur then
  return {0, tonumber(cur)}
end
if cur ~= '0' and not (owner and owner ~= '') and redis.call('HGET', KEYS[3], 'yaml') == ARGV[2] then
  return {2, tonumber(cur)}
end
local v = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[3], 'version', v, 'yaml', ARGV[2])
redis.call('HDEL', KEYS[3], 'owner', 'source')
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[4], v)
return {1, v}
