"""The module-level functions of ``composition.cache``, on the engine of
``COMPOSITION['CACHE_ALIAS']`` (``get_cache_aside()``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from composition.cache.engine import CacheResult
from composition.cache.handler import get_cache_aside

__all__ = [
    "cache_aside",
    "cache_aside_result",
    "invalidate",
    "invalidate_namespace",
    "replay_pending_invalidations",
]

T = TypeVar("T")


def cache_aside(key: str, loader: Callable[[], T], *, ttl_s: float, jitter: float = 0.1,
                stale_ttl_s: float | None = None, pattern: str | None = None,
                early_refresh: float = 0.0) -> T:
    """The cached value of ``key``, or ``loader()``'s value, cached for about ``ttl_s`` seconds.

    - ``ttl_s``: freshness in seconds; ``jitter`` (0 <= jitter < 1) shortens each TTL by a random
      fraction up to ``jitter`` so keys filled together do not expire together.
    - ``stale_ttl_s``: keep the value this many seconds past its TTL and serve it to callers that
      arrive while another caller rebuilds it.
    - ``pattern``: the metrics label (default: the key's namespace); keep it low-cardinality.
    - ``early_refresh``: XFetch beta (1.0 is typical, 0 disables): occasionally one caller rebuilds
      a fresh value shortly before it expires, so a hot key never goes cold.

    The loader runs at most once per process at a time and, across processes, only in the holder
    of a short rebuild lease; the others wait up to ``CACHE_LEASE_WAIT_S`` for its value. Values
    pass through the serializer on every path (JSON by default: tuples come back as lists,
    Decimals and datetimes as strings). When Redis is unreachable the loader's value is returned
    uncached; errors of the loader and of the serializer propagate.
    """
    return cache_aside_result(key, loader, ttl_s=ttl_s, jitter=jitter, stale_ttl_s=stale_ttl_s,
                              pattern=pattern, early_refresh=early_refresh).value


def cache_aside_result(key: str, loader: Callable[[], Any], *, ttl_s: float, jitter: float = 0.1,
                       stale_ttl_s: float | None = None, pattern: str | None = None,
                       early_refresh: float = 0.0) -> CacheResult:
    """``cache_aside`` that also says how the value was obtained (``CacheResult.outcome``:
    hit, loaded, waited, coalesced, stale, uncached or degraded)."""
    return get_cache_aside().fetch(key, loader, ttl_s=ttl_s, jitter=jitter, stale_ttl_s=stale_ttl_s,
                                   pattern=pattern, early_refresh=early_refresh)


def invalidate(key: str, *, using: str | None = None) -> None:
    """Delete ``key``'s cached value after the transaction on database ``using`` commits (at once
    outside a transaction). Nothing happens if the transaction rolls back.

    Also revokes any rebuild lease on the key, so a reader that loaded the old value before this
    write cannot cache it afterwards. Inside a transaction the invalidation is recorded in
    PostgreSQL in that transaction (durable at COMMIT; repeats of the same key are free) and the
    record is dropped once Redis applied it; whatever Redis did not apply (outage, a process that
    died after COMMIT) is applied by ``replay_pending_invalidations``. Outside a transaction it is
    recorded only when Redis cannot be reached. Raises the database error of that INSERT.
    """
    get_cache_aside().invalidate(key, using=using)


def invalidate_namespace(namespace: str, *, using: str | None = None) -> None:
    """Invalidate every key of ``namespace`` (one Redis INCR), with ``invalidate``'s guarantees."""
    get_cache_aside().invalidate_namespace(namespace, using=using)


def replay_pending_invalidations(alias: str | None = None) -> int:
    """Apply the recorded invalidations Redis has not applied yet; returns how many. Safe to run
    concurrently (rows another replayer holds are skipped). Raises the Redis or database error
    that prevented it (the rows stay for the next attempt)."""
    return get_cache_aside(alias).invalidations.replay_pending()
