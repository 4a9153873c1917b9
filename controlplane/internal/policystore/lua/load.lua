-- load.lua: read the whole store atomically.
-- KEYS[1] the store version counter, KEYS[2] the set of domain names,
-- KEYS[3] the hash of the sources' versions (path -> "stamp hash").
-- ARGV[1] the prefix of the domains' keys (it carries the same hash tag as
-- KEYS, so on Redis Cluster every key is in the script's slot).
-- Returns {store version, {domain, version, yaml, owner, source, ...},
-- {path, version, path, version, ...}}.
local domains = {}
for _, name in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local h = redis.call('HMGET', ARGV[1] .. name, 'version', 'yaml', 'owner', 'source')
  if h[1] and h[2] then
    domains[#domains + 1] = name
    domains[#domains + 1] = h[1]
    domains[#domains + 1] = h[2]
    domains[#domains + 1] = h[3] or ''
    domains[#domains + 1] = h[4] or ''
  end
end
return {redis.call('GET', KEYS[1]) or '0', domains, redis.call('HGETALL', KEYS[3])}
