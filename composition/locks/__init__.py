"""Locks that hold under races and outages; each raises LockNotAcquired (with ``.name``).

``row_lock(queryset)`` locks the rows you are about to change (SELECT ... FOR UPDATE);
``advisory_lock(namespace, key)`` serialises work on what is not (yet) a row, within one
transaction; ``redis_lock(name, ttl_s=...)`` coordinates work outside a transaction and expires, so
guard its writes with ``fenced_write(resource, lock.fence)``. See docs/cache_and_locks.md. None of
them replaces a unique constraint: a lock only orders the code paths that take it.
"""

from __future__ import annotations

from composition.locks.db import advisory_key, advisory_lock, row_lock
from composition.locks.errors import (
    LockBackendUnavailable,
    LockLost,
    LockNotAcquired,
    StaleFence,
    TransactionRequired,
)
from composition.locks.fencing import fenced_write
from composition.locks.redislock import RedisLock, acquire_redis_lock, redis_lock

__all__ = [
    "LockBackendUnavailable",
    "LockLost",
    "LockNotAcquired",
    "RedisLock",
    "StaleFence",
    "TransactionRequired",
    "acquire_redis_lock",
    "advisory_key",
    "advisory_lock",
    "fenced_write",
    "redis_lock",
    "row_lock",
]
