"""``redis_lock``: a Redis lease lock with an owner token, a TTL and a fencing token.

Acquire (``SET NX PX``) issues the next fence in the same script; release and extend check the
owner token, so they never touch a lock that expired and was taken by someone else. A fence is
``epoch << 32 | counter``, the epoch from a PostgreSQL sequence, renewed whenever Redis lost or
replaced its state: every fence issued after a Redis restart or failover is larger than every fence
before it. An unreachable Redis raises ``LockBackendUnavailable``: a correctness lock never
proceeds without its store (the cache ``COMPOSITION['CACHE_ALIAS']``).
"""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
import structlog
from django.core.cache import caches
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from composition.conf import conf, redis_client_of
from composition.errors import REDIS_ERRORS
from composition.locks.errors import LockBackendUnavailable, LockLost, LockNotAcquired
from composition.metrics import (
    LOCK_ACQUIRE,
    LOCK_HOLD_SECONDS,
    LOCK_LOST_TOTAL,
    LOCK_TIMEOUTS_TOTAL,
    LOCK_WAIT_SECONDS,
    key_label,
)
from composition.seconds import checked_seconds

__all__ = ["RedisLock", "acquire_redis_lock", "redis_lock"]

log = structlog.get_logger("composition.locks")

_UNAVAILABLE: tuple[type[BaseException], ...] = (*REDIS_ERRORS, DatabaseError)
# By thread, the (cache alias, name) of the redis_lock blocks it entered and has not left: taking
# one of them again waited on itself for wait_s, then said "busy". Each block removes its own
# entry, on the thread that entered it (a generator's block may end elsewhere, or out of order).
_held: dict[int, Counter[tuple[str, str]]] = {}
_held_lock = threading.Lock()
_MAX_POLL_S = 0.05
# A lock held, or waited for, longer than a week is a mistake (1e20 s overflowed Redis's PX).
MAX_TTL_S = 7 * 86_400.0

# Both scripts start with the server process's run_id: new at every start, other on every replica.
# A new run_id means a new epoch: a restart from an older snapshot or a truncated AOF, or a replica
# promoted while behind, may hold an older counter and would hand out fences already issued.
# A provider that refuses INFO in scripts gets '' (no restart detection, as before; not a failure).
_SERVER_RUN_ID = """
local info = redis.pcall('INFO', 'server')
local server = type(info) == 'string' and string.match(info, 'run_id:(%x+)') or ''
"""

# KEYS: lock, fence hash. ARGV: token, px. Returns -1 (no epoch yet, one this server process did
# not install, or the counter is spent: install a new epoch), 0 (busy) or {epoch, counter}. The
# counter is bumped in the same script as the SET, so fence order is acquisition order.
_ACQUIRE = _SERVER_RUN_ID + """local state = redis.call('HMGET', KEYS[2], 'epoch', 'n', 'server')
if not state[1] or state[3] ~= server or tonumber(state[2] or '0') >= 4294967295 then return -1 end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {state[1], redis.call('HINCRBY', KEYS[2], 'n', 1)}
end
return 0
"""

# KEYS: fence hash. ARGV: epoch. Only a newer epoch replaces the current one.
_INSTALL_EPOCH = _SERVER_RUN_ID + """local current = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
if tonumber(ARGV[1]) > current then redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'n', 0, 'server', server) end
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


class _Store:
    """The Redis client and registered scripts of one cache alias."""

    def __init__(self, alias: str) -> None:
        cache: Any = caches[alias]
        self.client: redis.Redis = redis_client_of(alias, "redis_lock")
        self.prefix = str(cache.make_key("composition:lock:"))
        self.fence_key = str(cache.make_key("composition:lock-fence"))
        self.acquire = self.client.register_script(_ACQUIRE)
        self.install_epoch = self.client.register_script(_INSTALL_EPOCH)
        self.release = self.client.register_script(_RELEASE)
        self.extend = self.client.register_script(_EXTEND)


_stores: dict[str, _Store] = {}
_stores_lock = threading.Lock()


def _store() -> _Store:
    alias = conf.CACHE_ALIAS
    store = _stores.get(alias)
    if store is None:
        with _stores_lock:
            store = _stores.get(alias) or _stores.setdefault(alias, _Store(alias))
    return store


def _reset(*, setting: str, **_: Any) -> None:
    if setting in ("CACHES", "COMPOSITION"):
        with _stores_lock:
            _stores.clear()


setting_changed.connect(_reset, dispatch_uid="composition-redis-lock-reset")


def _next_epoch() -> int:
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute("SELECT nextval('composition_lock_fence_epoch')")
        return int(cursor.fetchone()[0])


class RedisLock:
    """A held Redis lock. ``fence`` is larger than the fence of every earlier acquisition of any
    redis_lock (pass it to ``fenced_write``); ``token`` identifies this owner."""

    def __init__(self, store: _Store, name: str, token: str, fence: int, acquired_at: float) -> None:
        self._store = store
        self.name = name
        self.token = token
        self.fence = fence
        self._acquired_at = acquired_at
        self.released = False
        # Set when release() found the lock no longer ours: it had expired under its holder.
        self.lost = False

    @property
    def _key(self) -> str:
        return self._store.prefix + self.name

    def extend(self, ttl_s: float) -> None:
        """Make the lock expire ``ttl_s`` seconds from now. Raises LockLost if it is no longer
        ours (it expired, maybe someone else holds it), LockBackendUnavailable if Redis is down,
        ValueError for a ``ttl_s`` ``acquire_redis_lock`` would refuse (``extend(0)`` let it go)."""
        ttl_s = checked_seconds("ttl_s", ttl_s, at_most=MAX_TTL_S)
        try:
            ok = self._store.extend(keys=[self._key], args=[self.token, max(1, round(ttl_s * 1000))])
        except REDIS_ERRORS as exc:
            raise LockBackendUnavailable(self.name, f"redis unreachable: {exc}") from exc
        if not ok:
            raise LockLost(self.name, "it expired while held, before extend(); another owner may hold it")

    def release(self) -> bool:
        """Delete the lock if this owner still holds it; False when it had already expired (then
        whoever holds it now keeps it). Redis errors are swallowed: the TTL frees the lock."""
        if self.released:
            return False
        self.released = True
        LOCK_HOLD_SECONDS.labels("redis", key_label(self.name)).observe(time.monotonic() - self._acquired_at)
        try:
            released = bool(self._store.release(keys=[self._key], args=[self.token]))
        except REDIS_ERRORS:
            return False
        self.lost = not released
        return released


def acquire_redis_lock(name: str, *, ttl_s: float, wait_s: float = 0) -> RedisLock:
    """Acquire the Redis lock ``name`` for ``ttl_s`` seconds, waiting up to ``wait_s`` seconds.

    Raises LockNotAcquired(name) when it stays busy, LockBackendUnavailable (a LockNotAcquired)
    when Redis cannot be reached. The caller must ``release()`` it (``redis_lock`` does).
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"a lock name is a non-empty string, got {name!r}")
    ttl_s = checked_seconds("ttl_s", ttl_s, at_most=MAX_TTL_S)
    wait_s = checked_seconds("wait_s", wait_s, at_most=MAX_TTL_S, zero=True)
    held_here = _held.get(threading.get_ident())
    if held_here and held_here[(conf.CACHE_ALIAS, name)]:
        raise RuntimeError(f"redis lock {name!r} is held already by this thread, in a redis_lock block around "
                           "this call: a redis lock is not re-entrant (take it once, and pass the held lock down)")
    store = _store()
    label = key_label(name)
    token = secrets.token_hex(16)
    ttl_ms = max(1, round(ttl_s * 1000))
    started = time.monotonic()
    deadline = started + max(0.0, wait_s)
    poll_s = 0.002
    epochs_installed = 0
    while True:
        try:
            result = store.acquire(keys=[store.prefix + name, store.fence_key], args=[token, ttl_ms])
            if result == -1 and epochs_installed < 3:
                epochs_installed += 1
                store.install_epoch(keys=[store.fence_key], args=[_next_epoch()])
                continue
        except _UNAVAILABLE as exc:
            _record(label, "unavailable", started)
            _forget_unanswered(store, store.prefix + name, token)
            raise LockBackendUnavailable(name, f"lock store unreachable: {exc}") from exc
        if result == -1:
            _record(label, "unavailable", started)
            raise LockBackendUnavailable(name, "no fencing epoch could be installed")
        if result != 0:
            epoch, counter = int(result[0]), int(result[1])
            _record(label, "acquired", started)
            return RedisLock(store, name, token, epoch << 32 | counter, time.monotonic())
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            _record(label, "busy", started)
            if wait_s > 0:  # waited the whole wait_s, unlike a try-once refusal
                LOCK_TIMEOUTS_TOTAL.labels("redis", label).inc()
            raise LockNotAcquired(name, "busy" if wait_s <= 0 else f"busy for {wait_s}s")
        # Jittered backoff, so waiters on one lock do not poll in lockstep.
        time.sleep(min(remaining_s, poll_s * random.uniform(0.5, 1.0)))
        poll_s = min(poll_s * 2, _MAX_POLL_S)


def _forget_unanswered(store: _Store, key: str, token: str) -> None:
    """After an acquisition whose answer was lost (a timeout): it may have taken the lock all
    the same, which nobody would then release before its TTL. Best effort: Redis may be down."""
    try:
        store.release(keys=[key], args=[token])
    except REDIS_ERRORS:
        pass


def _record(label: str, outcome: str, started: float) -> None:
    LOCK_ACQUIRE.labels("redis", label, outcome).inc()
    LOCK_WAIT_SECONDS.labels("redis", label).observe(time.monotonic() - started)


@contextmanager
def redis_lock(name: str, *, ttl_s: float, wait_s: float = 0) -> Iterator[RedisLock]:
    """Hold the Redis lock ``name`` for the with-block (see ``acquire_redis_lock``); released on
    exit, also when the body raises. If the body outlives ``ttl_s`` the lock may pass to someone
    else: extend it, and guard writes with ``fenced_write(resource, lock.fence)``.
    The metric label is the text of ``name`` before its first ``:`` ("(none)" without one)."""
    lock = acquire_redis_lock(name, ttl_s=ttl_s, wait_s=wait_s)
    held, thread = (conf.CACHE_ALIAS, name), threading.get_ident()
    with _held_lock:
        _held.setdefault(thread, Counter())[held] += 1
    try:
        yield lock
    finally:
        try:
            lock.release()
            if lock.lost:
                # The TTL ran out under the body: someone else may have held it meanwhile. Only the
                # fence (fenced_write) protected the writes; say so where an operator looks.
                LOCK_LOST_TOTAL.labels("redis", key_label(name)).inc()
                log.warning("redis lock expired before its with-block ended; another owner may have held it",
                            lock=name, ttl_s=ttl_s)
        finally:
            with _held_lock:
                _held[thread][held] -= 1
                if _held[thread][held] <= 0:
                    del _held[thread][held]
                if not _held[thread]:
                    del _held[thread]
