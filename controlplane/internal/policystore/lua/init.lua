-- init.lua: write a whole state into an empty store (no version counter).
-- KEYS[1] the store version counter, KEYS[2] the set of domain names,
-- KEYS[3] the hash of the sources' versions.
-- ARGV[1] the prefix of the domains' keys, ARGV[2] change channel,
-- ARGV[3] the store version to set, ARGV[4] the number n of sources, then
-- n pairs path, version (ARGV[5 ..]), then one quintuple per domain:
-- domain, version, yaml, owner, source ("" when the store owns it).
-- Returns 1 when written, 0 when the store was not empty.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
-- Leftovers of a partly lost store are dropped so the state is exactly ARGV.
for _, name in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  redis.call('DEL', ARGV[1] .. name)
end
redis.call('DEL', KEYS[2], KEYS[3])
local first = 5 + 2 * tonumber(ARGV[4])
for i = 5, first - 1, 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
end
for i = first, #ARGV, 5 do
  local key = ARGV[1] .. ARGV[i]
  redis.call('HSET', key, 'version', ARGV[i + 1], 'yaml', ARGV[i + 2])
  if ARGV[i + 3] ~= '' then
    redis.call('HSET', key, 'owner', ARGV[i + 3], 'source', ARGV[i + 4])
  end
  redis.call('SADD', KEYS[2], ARGV[i])
end
redis.call('SET', KEYS[1], ARGV[3])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
