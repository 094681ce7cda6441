"""Cache-aside over django-redis that holds under races, stampedes and outages.

``cache_aside(key, loader, ttl_s=...)`` returns the cached value or runs ``loader()`` once to
rebuild it; ``invalidate(key)`` deletes it after the current transaction commits;
``invalidate_namespace(ns)`` drops every key of a namespace (the text before the first ``:``).
Modules: ``api``, ``arguments`` (what it accepts), ``handler`` (one engine per alias, rebuilt when
settings change), ``engine`` (serving policy), ``store`` (Redis keys and scripts), ``epoch`` (what
a Redis restart makes a miss), ``flights`` (in-process coalescing), ``coalescing`` (who waits for
whose load), ``invalidation`` (durable invalidations), ``replay``, ``serializers``, ``errors``.
"""

from __future__ import annotations

from composition.cache.api import (
    cache_aside,
    cache_aside_result,
    invalidate,
    invalidate_namespace,
    replay_pending_invalidations,
)
from composition.cache.engine import CacheAside, CacheResult, namespace_of
from composition.cache.errors import CacheConfigurationError
from composition.cache.handler import get_cache_aside
from composition.cache.replay import InvalidationReplayComponent
from composition.cache.serializers import JSONSerializer, Serializer

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
