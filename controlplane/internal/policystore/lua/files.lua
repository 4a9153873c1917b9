-- files.lua: put policy files in force: the rule of SourceState (sources.go),
-- atomically. applySources in sources.go is the same rule in Go; the tests
-- run both.
-- KEYS[1] the store version counter, KEYS[2] the set of domain names,
-- KEYS[3] the hash of the sources' versions (path -> "stamp hash", whose
-- string order is the versions' order).
-- ARGV[1] the prefix of the domains' keys, ARGV[2] change channel, ARGV[3]
-- the number of sources, then per source: path, version, hash, the number
-- n of its domains, then n triples domain, owner (the file), yaml.
-- Returns {-2} when the store is not initialized, else {new store version
-- (0: no domain changed), per source {outcome (1 in force, 2 older),
-- version in force, {changed}, {unchanged}, {deleted}, {kept}}}.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {-2}
end
local prefix = ARGV[1]
local srcs = {}
local i = 4
for s = 1, tonumber(ARGV[3]) do
  local src = {path = ARGV[i], order = ARGV[i + 1], hash = ARGV[i + 2], recs = {}}
  local n = tonumber(ARGV[i + 3])
  i = i + 4
  for r = 1, n do
    src.recs[r] = {domain = ARGV[i], owner = ARGV[i + 1], yaml = ARGV[i + 2]}
    i = i + 3
  end
  srcs[s] = src
end
local hashOf = function(order) return string.sub(order, 22) end
-- Which sources are put in force, and their versions in force.
for _, src in ipairs(srcs) do
  local cur = redis.call('HGET', KEYS[3], src.path)
  if cur and hashOf(cur) ~= src.hash and src.order < cur then
    src.outcome, src.inforce = 2, cur
  else
    src.outcome, src.inforce = 1, src.order
    if cur and hashOf(cur) == src.hash and cur > src.order then
      src.inforce = cur
    end
    if src.inforce ~= cur then
      redis.call('HSET', KEYS[3], src.path, src.inforce)
    end
  end
end
local v = false
local version = function()
  if not v then
    v = redis.call('INCR', KEYS[1])
  end
  return v
end
local out = {0}
for _, src in ipairs(srcs) do
  local changed, unchanged, deleted, kept = {}, {}, {}, {}
  if src.outcome == 1 then
    local named = {}
    for _, r in ipairs(src.recs) do
      named[r.domain] = true
      local key = prefix .. r.domain
      local e = false
      if redis.call('SISMEMBER', KEYS[2], r.domain) == 1 then
        e = redis.call('HMGET', key, 'yaml', 'owner', 'source')
      end
      local other = e and e[3] and e[3] ~= '' and e[3] ~= src.path
      local q = other and redis.call('HGET', KEYS[3], e[3])
      if q and q > src.inforce then
        kept[#kept + 1] = r.domain
      elseif e and e[1] == r.yaml and e[2] == r.owner and e[3] == src.path then
        unchanged[#unchanged + 1] = r.domain
      else
        redis.call('DEL', key)
        redis.call('HSET', key, 'version', version(), 'yaml', r.yaml, 'owner', r.owner, 'source', src.path)
        redis.call('SADD', KEYS[2], r.domain)
        changed[#changed + 1] = r.domain
      end
    end
    for _, name in ipairs(redis.call('SMEMBERS', KEYS[2])) do
      if not named[name] and redis.call('HGET', prefix .. name, 'source') == src.path then
        version()
        redis.call('DEL', prefix .. name)
        redis.call('SREM', KEYS[2], name)
        deleted[#deleted + 1] = name
      end
    end
  end
  out[#out + 1] = {src.outcome, src.inforce, changed, unchanged, deleted, kept}
end
if v then
  out[1] = v
  redis.call('PUBLISH', ARGV[2], v)
end
return out
