"""A rebuild of one cache key under its lease (the scripts: ``composition.cache.store``).

Take the lease, or find the entry fresh, or wait while another process holds it; run the loader;
store its value unless an invalidation revoked the lease meanwhile. Every result holds the
serialized payload (bytes), so each caller, leader or not, decodes its own copy. Each read
(ACQUIRE, the loader) is marked on the flight first (``Flight.reading``): its joiners go by it.
"""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from composition.cache.flights import Flight
from composition.cache.results import DEGRADED, HIT, LOADED, STALE, UNCACHED, WAITED, CacheResult, PatternMetrics
from composition.cache.serializers import Serializer
from composition.cache.store import FRESH, LEASED, LeaseStore, encode_entry
from composition.errors import REDIS_ERRORS
from composition.metrics import CACHE_OPERATION_SECONDS

__all__ = ["Call", "Rebuilder"]

log = structlog.get_logger("composition.cache")

_MAX_POLL_S = 0.05


@dataclass(frozen=True)
class Call:
    """One ``fetch`` of a key, as its rebuild needs it."""

    key: str
    keys: tuple[str, str, str, str]  # namespace, entry, lease, epoch (KeySpace.of)
    loader: Callable[[], Any]
    ttl_s: float
    jitter: float
    stale_ttl_s: float | None
    metrics: PatternMetrics


class Rebuilder:
    """Rebuilds for one cache alias; ``redis_failed(metrics, exc)`` is told of every Redis error."""

    def __init__(self, store: LeaseStore, serializer: Serializer, *, alias: str, lease_ttl_s: float,
                 lease_wait_s: float, redis_failed: Callable[[PatternMetrics, BaseException], None]) -> None:
        self.store = store
        self.serializer = serializer
        self.alias = alias
        self.lease_ttl_s = lease_ttl_s
        self.lease_wait_s = lease_wait_s
        self._redis_failed = redis_failed
        # Resolved once: observing a labelled child costs a lookup each rebuild need not pay.
        self._acquire_seconds = CACHE_OPERATION_SECONDS.labels("acquire")
        self._fill_seconds = CACHE_OPERATION_SECONDS.labels("fill")

    def degraded(self, call: Call, flight: Flight) -> CacheResult:
        """The loader's value, with Redis out of the way (down, or its breaker open)."""
        flight.reading()
        return CacheResult(self.serializer.dumps(call.loader()), DEGRADED)

    def rebuild(self, call: Call, fallback: CacheResult | None, flight: Flight) -> CacheResult:
        """The value of ``call.key`` after a miss; ``fallback`` (the stale value, or the fresh one an
        early refresh replaces) is served at once when another process holds the lease."""
        token = secrets.token_hex(16)
        # At least 1 ms: PX 0 is an error Redis answers every call with, which read as an outage.
        lease_ms = max(1, int(self.lease_ttl_s * 1000))
        # Early refresh: the entry is fresh and this caller rebuilds it anyway.
        rebuild_even_if_fresh = fallback is not None and fallback.outcome == HIT
        deadline = time.monotonic() + self.lease_wait_s
        poll_s = 0.005
        waited = False
        while True:
            flight.reading()
            started = time.perf_counter()
            try:
                status, version, entry = self.store.acquire(call.keys, token, lease_ms,
                                                           rebuild_even_if_fresh=rebuild_even_if_fresh)
            except REDIS_ERRORS as exc:
                self._acquire_seconds.observe(time.perf_counter() - started)
                self._redis_failed(call.metrics, exc)
                return self.degraded(call, flight)
            self._acquire_seconds.observe(time.perf_counter() - started)
            if status == FRESH:
                assert entry is not None
                return CacheResult(entry.payload, WAITED if waited else HIT)
            if status == LEASED:
                flight.lease = (token, version)
                flight.reading()  # the loader's
                return self._load_and_fill(call, token, version, lease_ms)
            if not waited:
                call.metrics.lease_rejected("acquire")
                waited = True
            if fallback is not None:
                if fallback.outcome == STALE:
                    call.metrics.stale.inc()
                # Read by the leader's own lookup, before any joiner's call began, maybe before a
                # write a joiner must see (it found no entry): no joiner takes it.
                flight.read_at = 0
                return fallback
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                call.metrics.error("lease_wait_timeout")
                flight.reading()
                return CacheResult(self.serializer.dumps(call.loader()), UNCACHED)
            time.sleep(min(poll_s, remaining_s))
            poll_s = min(poll_s * 2, _MAX_POLL_S)

    def _load_and_fill(self, call: Call, token: str, version: bytes, lease_ms: int) -> CacheResult:
        started = time.monotonic()
        try:
            payload = self.serializer.dumps(call.loader())
        except BaseException:
            self._give_back(call, token)
            raise
        rebuild_s = time.monotonic() - started
        call.metrics.rebuild.observe(rebuild_s)
        ttl_s = call.ttl_s * (1.0 - call.jitter * random.random())  # jitter only shortens the TTL
        fresh_until_ms = int((time.time() + ttl_s) * 1000)
        expire_ms = max(1, int((ttl_s + (call.stale_ttl_s or 0.0)) * 1000))
        entry = encode_entry(version, fresh_until_ms, int(rebuild_s * 1000), payload)
        started = time.perf_counter()
        try:
            filled = self.store.fill(call.keys, token, version, entry, expire_ms)
        except REDIS_ERRORS as exc:
            self._fill_seconds.observe(time.perf_counter() - started)
            self._redis_failed(call.metrics, exc)
            return CacheResult(payload, DEGRADED)
        self._fill_seconds.observe(time.perf_counter() - started)
        if not filled:
            call.metrics.lease_rejected("fill")
            if rebuild_s * 1000 >= lease_ms:
                # Not an invalidation: the lease ran out under a slow loader. Nothing it loads is
                # ever stored, and every caller runs it again, until the lease outlasts it.
                log.warning("cache rebuild outlasted its lease; the value was not cached", alias=self.alias,
                            key=call.key, rebuild_s=round(rebuild_s, 3), lease_ttl_s=self.lease_ttl_s,
                            fix="raise COMPOSITION['CACHE_LEASE_TTL_S'] or make the loader cheaper")
            return CacheResult(payload, UNCACHED)
        return CacheResult(payload, LOADED)

    def _give_back(self, call: Call, token: str) -> None:
        try:
            self.store.release(call.keys[2], token)
        except REDIS_ERRORS:
            pass  # the lease expires on its own
