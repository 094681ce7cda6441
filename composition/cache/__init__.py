"""Cache-aside over django-redis that holds under races, stampedes and outages.

``cache_aside(key, loader, ttl_s=...)`` returns the cached value for ``key`` or runs
``loader()`` once to rebuild it; ``invalidate(key)`` deletes it after the current transaction
commits; ``invalidate_namespace(ns)`` drops every key of a namespace (the text before a key's
first ``:``) with one call. The protocol is described in ``composition.cache.engine``.

Engines are built lazily per cache alias from ``COMPOSITION`` and rebuilt when ``CACHES`` or
``COMPOSITION`` change (``override_settings`` works in tests).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.core.signals import setting_changed

from composition.cache.engine import CacheAside, CacheResult, namespace_of
from composition.cache.errors import CacheConfigurationError
from composition.cache.replay import InvalidationReplayComponent
from composition.cache.serializers import JSONSerializer, Serializer
from composition.conf import conf

__all__ = [
    "CacheAside",
    "CacheConfigurationError",
    "CacheResult",
    "InvalidationReplayComponent",
    "JSONSerializer",
    "Serializer",
    "cache_aside",
    "cache_aside_result",
    "get_cache_aside",
    "invalidate",
    "invalidate_namespace",
    "namespace_of",
    "replay_pending_invalidations",
]

T = TypeVar("T")

_engines: dict[str, CacheAside] = {}
_default: CacheAside | None = None  # the engine of COMPOSITION['CACHE_ALIAS'], without a settings read
_engines_lock = threading.Lock()


def get_cache_aside(alias: str | None = None) -> CacheAside:
    """The engine for cache ``alias`` (default ``COMPOSITION['CACHE_ALIAS']``), built on first use.

    Raises CacheConfigurationError when the alias is unknown or not a django-redis cache.
    """
    global _default
    if alias is None and _default is not None:
        return _default
    name = alias or conf.CACHE_ALIAS
    engine = _engines.get(name)
    if engine is None:
        with _engines_lock:
            engine = _engines.get(name)
            if engine is None:
                engine = _engines[name] = _build(name)
    if alias is None:
        _default = engine
    return engine


def _build(alias: str) -> CacheAside:
    from django.core.cache import InvalidCacheBackendError

    from composition.cache.serializers import load_serializer

    try:
        return CacheAside(
            alias,
            serializer=load_serializer(conf.CACHE_SERIALIZER),
            lease_ttl_s=float(conf.CACHE_LEASE_TTL_S),
            lease_wait_s=float(conf.CACHE_LEASE_WAIT_S),
            breaker_failures=int(conf.CACHE_BREAKER_FAILURES),
            breaker_reset_s=float(conf.CACHE_BREAKER_RESET_S),
        )
    except InvalidCacheBackendError as exc:
        raise CacheConfigurationError(f"cache alias {alias!r} is not configured: {exc}") from exc
    except AttributeError as exc:
        raise CacheConfigurationError(f"cache alias {alias!r} is not a django-redis cache") from exc


def _reset(*, setting: str, **_: Any) -> None:
    global _default
    if setting in ("CACHES", "COMPOSITION"):
        with _engines_lock:
            _engines.clear()
            _default = None


setting_changed.connect(_reset, dispatch_uid="composition-cache-reset")


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
    _validate(ttl_s, jitter, stale_ttl_s)
    return get_cache_aside().fetch(key, loader, ttl_s=ttl_s, jitter=jitter, stale_ttl_s=stale_ttl_s,
                                   pattern=pattern, early_refresh=early_refresh)


def _validate(ttl_s: float, jitter: float, stale_ttl_s: float | None) -> None:
    if not ttl_s > 0:
        raise ValueError(f"ttl_s must be positive, got {ttl_s!r}")
    if not 0 <= jitter < 1:
        raise ValueError(f"jitter must be in [0, 1), got {jitter!r}")
    if stale_ttl_s is not None and stale_ttl_s < 0:
        raise ValueError(f"stale_ttl_s must not be negative, got {stale_ttl_s!r}")


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
    from composition.cache.models import PendingInvalidation

    get_cache_aside().invalidations.schedule(PendingInvalidation.KIND_KEY, key, using=using)


def invalidate_namespace(namespace: str, *, using: str | None = None) -> None:
    """Invalidate every key of ``namespace`` (one Redis INCR), with ``invalidate``'s guarantees."""
    from composition.cache.models import PendingInvalidation

    get_cache_aside().invalidations.schedule(PendingInvalidation.KIND_NAMESPACE, namespace, using=using)


def replay_pending_invalidations(alias: str | None = None) -> int:
    """Apply the recorded invalidations Redis has not applied yet; returns how many. Safe to run
    concurrently (rows another replayer holds are skipped). Raises the Redis or database error
    that prevented it (the rows stay for the next attempt)."""
    return get_cache_aside(alias).invalidations.replay_pending()
