-- put.lua: store one domain's policy if the version guard holds.
-- KEYS[1] the store version counter, KEYS[2] the set of domain names,
-- KEYS[3] the domain's hash {version, yaml}.
-- ARGV[1] domain, ARGV[2] yaml, ARGV[3] expected version ("" = no guard),
-- ARGV[4] change channel.
-- Returns {status, version}: status 1 written (version = the new store
-- version), 2 unchanged (byte-identical; the domain's version), 0 guard
-- failed (the domain's version, 0 when absent), -2 the store is not
-- initialized (no version counter: new or lost; Init it first).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {-2, 0}
end
-- The set of names is the truth: a hash left over without its name (a
-- partly lost store) counts as absent and is overwritten.
local cur = '0'
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  cur = redis.call('HGET', KEYS[3], 'version') or '0'
end
if ARGV[3] ~= '' and ARGV[3] ~= cur then
  return {0, tonumber(cur)}
end
if cur ~= '0' and redis.call('HGET', KEYS[3], 'yaml') == ARGV[2] then
  return {2, tonumber(cur)}
end
local v = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[3], 'version', v, 'yaml', ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[4], v)
return {1, v}
