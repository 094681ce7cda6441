"""Locks that hold under races and outages; each raises LockNotAcquired (with ``.name``).

Which one to use (see docs/cache_and_locks.md):

- ``row_lock(queryset)``: the rows you are about to change exist; lock them in the transaction
  that changes them (SELECT ... FOR UPDATE).
- ``advisory_lock(namespace, key)``: serialise work on something that is not (yet) a row, e.g.
  "create the invoice for order 42", within one PostgreSQL transaction.
- ``redis_lock(name, ttl_s=...)``: coordinate work that happens outside a database transaction
  (calls to other services, long jobs); it expires, so guard its writes with
  ``fenced_write(resource, lock.fence)``.

None of them replaces a unique constraint: a lock only orders the code paths that take it.
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
