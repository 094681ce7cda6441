"""What one cache-aside call returns and counts: its outcome names, its result, and the metric
children of its key pattern."""

from __future__ import annotations

from typing import Any, NamedTuple

from composition.metrics import (
    CACHE_COALESCED,
    CACHE_ERRORS,
    CACHE_HITS,
    CACHE_LEASE_REJECTIONS,
    CACHE_MISSES,
    CACHE_REBUILD_SECONDS,
    CACHE_STALE_SERVED,
)

__all__ = ["COALESCED", "DEGRADED", "HIT", "LOADED", "STALE", "UNCACHED", "WAITED", "CacheResult",
           "PatternMetrics", "namespace_of"]

# Outcomes of one call, as reported by CacheResult.outcome.
HIT = "hit"                # a fresh cached value
LOADED = "loaded"          # this caller held the lease, ran the loader and cached the value
WAITED = "waited"          # another process rebuilt the value while this caller waited
COALESCED = "coalesced"    # another thread of this process rebuilt it while this caller waited
STALE = "stale"            # a stale value, served while someone else rebuilds
UNCACHED = "uncached"      # loaded, not cached (lease revoked by an invalidation, or wait timed out)
DEGRADED = "degraded"      # Redis unreachable or breaker open: the loader's value, not cached


def namespace_of(key: str) -> str:
    """The namespace of a key is the text before its first ``:`` (the whole key without one)."""
    return key.split(":", 1)[0]


class CacheResult(NamedTuple):
    """A value and how it was obtained (one of the outcome strings above)."""

    value: Any
    outcome: str


class PatternMetrics:
    """The labelled metric children of one pattern, resolved once (the hit path is hot)."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.hits = CACHE_HITS.labels(pattern)
        self.misses = CACHE_MISSES.labels(pattern)
        self.stale = CACHE_STALE_SERVED.labels(pattern)
        self.coalesced = CACHE_COALESCED.labels(pattern)
        self.rebuild = CACHE_REBUILD_SECONDS.labels(pattern)

    def error(self, reason: str) -> None:
        CACHE_ERRORS.labels(self.pattern, reason).inc()

    def lease_rejected(self, stage: str) -> None:
        CACHE_LEASE_REJECTIONS.labels(self.pattern, stage).inc()
