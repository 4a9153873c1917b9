-- init.lua: write a whole state into an empty store (no version counter).
-- KEYS[1] the store version counter, KEYS[2] the set of domain names.
-- ARGV[1] the prefix of the domains' keys, ARGV[2] change channel,
-- ARGV[3] the store version to set, then one triple per domain:
-- domain, version, yaml.
-- Returns 1 when written, 0 when the store was not empty.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
-- Leftovers of a partly lost store are dropped so the state is exactly ARGV.
for _, name in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  redis.call('DEL', ARGV[1] .. name)
end
redis.call('DEL', KEYS[2])
for i = 4, #ARGV, 3 do
  redis.call('HSET', ARGV[1] .. ARGV[i], 'version', ARGV[i + 1], 'yaml', ARGV[i + 2])
  redis.call('SADD', KEYS[2], ARGV[i])
end
redis.call('SET', KEYS[1], ARGV[3])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
