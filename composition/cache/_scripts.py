"""Lua scripts of the cache-aside protocol. Each runs atomically in Redis, so a check and the
write it guards can never be split by another client's command.

Entry layout: ``b"<namespace version>|<fresh until, unix ms>|<rebuild ms>|<payload>"``.
A missing namespace key means version ``0``.
"""

from __future__ import annotations

# KEYS: namespace, entry, lease. ARGV: token, lease ms, now ms, rebuild even if fresh (1: take
# the lease even when the entry is fresh; the early-refresh path). Returns {status, namespace version, entry}
# with status 0 = fresh hit, 1 = lease taken (rebuild now), 2 = someone else holds the lease.
ACQUIRE = """
local ns = redis.call('GET', KEYS[1]) or '0'
local e = redis.call('GET', KEYS[2])
if e and ARGV[4] == '0' then
  local v, fresh = string.match(e, '^(%d+)|(%d+)|')
  if v == ns and tonumber(fresh) > tonumber(ARGV[3]) then
    return {0, ns, e}
  end
end
if redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, ns, e or false}
end
return {2, ns, e or false}
"""

# KEYS: namespace, entry, lease. ARGV: token, namespace version read with the lease, entry, px.
# The fill happens only while the caller still owns its lease (an invalidation deletes leases)
# and the namespace was not bumped meanwhile: this is what stops a slow reader from writing back
# a value loaded before a writer's invalidation. Returns 1 filled, 0 lease lost, -1 ns bumped.
FILL = """
if redis.call('GET', KEYS[3]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[3])
if (redis.call('GET', KEYS[1]) or '0') ~= ARGV[2] then return -1 end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
return 1
"""

# KEYS: lease. ARGV: token. Give a lease back (the loader failed) unless it is someone else's.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
