"""Lua scripts of the cache-aside protocol. Each runs atomically in Redis, so a check and the
write it guards can never be split by another client's command.

Entry layout: ``b"<version>|<fresh until, unix ms>|<rebuild ms>|<payload>"``, the version being
``<epoch>/<namespace version>`` (``VERSION`` below; ``composition.cache.store`` says why).
A missing namespace key means version ``0``, a missing epoch the empty string.
"""

from __future__ import annotations

# The version entries are written under, from KEYS[4] (the epoch) and KEYS[1] (the namespace).
VERSION = """
local version = (redis.call('GET', KEYS[4]) or '') .. '/' .. (redis.call('GET', KEYS[1]) or '0')
"""

# KEYS: namespace, entry, lease, epoch. ARGV: token, lease ms, now ms, rebuild even if fresh (1:
# take the lease even when the entry is fresh; the early-refresh path). Returns {status, version,
# entry} with status 0 = fresh hit, 1 = lease taken (rebuild now), 2 = someone else holds the lease.
ACQUIRE = VERSION + """local e = redis.call('GET', KEYS[2])
if e and ARGV[4] == '0' then
  local v, fresh = string.match(e, '^([^|]*)|(%d+)|')
  if v == version and tonumber(fresh) > tonumber(ARGV[3]) then
    return {0, version, e}
  end
end
if redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, version, e or false}
end
return {2, version, e or false}
"""

# KEYS: namespace, entry, lease, epoch. ARGV: token, version read with the lease, entry, px.
# The fill happens only while the caller still owns its lease (an invalidation deletes leases)
# and the version did not change meanwhile (namespace bumped, new epoch): this is what stops a
# slow reader from writing back a value loaded before a writer's invalidation. Returns 1 filled,
# 0 lease lost, -1 version changed.
FILL = """
if redis.call('GET', KEYS[3]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[3])
""" + VERSION + """if version ~= ARGV[2] then return -1 end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
return 1
"""

# KEYS: epoch. ARGV: a new random token, the epoch this process read last ('' if none). The epoch
# is "<run_id>:<token>", run_id being the Redis server process's (new at every start, other on a
# replica): when the running server is not the one that installed the epoch, it restarted (maybe
# from an older snapshot) or a replica took over, and a new token makes every entry from before a
# miss. A missing key on the same server (deleted, evicted) gets the caller's last epoch back,
# not a new one: nothing went back in time. A client refused INFO (a provider's ACL) sees server
# '': it keeps whatever epoch is there and installs one only where there is none, so clients that
# differ on INFO never take turns replacing it. Returns {1 when it installed a new one, else 0;
# the epoch}.
ENSURE_EPOCH = """
local info = redis.pcall('INFO', 'server')
local server = type(info) == 'string' and string.match(info, 'run_id:(%x+)') or ''
local current = redis.call('GET', KEYS[1])
if current and (server == '' or string.sub(current, 1, #server + 1) == server .. ':') then
  return {0, current}
end
local last = ARGV[2]
if not current and last ~= '' and server ~= '' and string.sub(last, 1, #server + 1) == server .. ':' then
  redis.call('SET', KEYS[1], last)
  return {0, last}
end
current = server .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], current)
return {1, current}
"""

# KEYS: lease. ARGV: token. Give a lease back (the loader failed) unless it is someone else's.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
