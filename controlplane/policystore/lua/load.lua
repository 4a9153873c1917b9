-- load.lua: read the whole store atomically.
-- KEYS[1] the store version counter, KEYS[2] the set of domain names.
-- ARGV[1] the prefix of the domains' keys (it carries the same hash tag as
-- KEYS, so on Redis Cluster every key is in the script's slot).
-- Returns {store version, domain, version, yaml, domain, version, yaml, ...}.
local out = {redis.call('GET', KEYS[1]) or '0'}
for _, name in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local h = redis.call('HMGET', ARGV[1] .. name, 'version', 'yaml')
  if h[1] and h[2] then
    out[#out + 1] = name
    out[#out + 1] = h[1]
    out[#out + 1] = h[2]
  end
end
return out
