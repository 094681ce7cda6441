"""The cache-aside engine for one django-redis cache alias: who loads, who waits, what is served.

A hit is one ``MGET`` of the namespace version and the entry (its version: that namespace version
and the epoch, ``composition.cache.epoch``). On a miss one caller per process rebuilds under a
lease (``composition.cache.rebuild``; the Redis layout and scripts: ``composition.cache.store``);
the others share its value, or serve stale (``composition.cache.coalescing``).
Invalidation (``composition.cache.invalidation``) is recorded with the write and replayed if it
never reached Redis. What a changer must keep: nothing raises because Redis is down; failures
and an open breaker degrade to the loader.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import structlog
from django.core.cache import caches
from django.db import DEFAULT_DB_ALIAS, connections

from composition.breaker import CircuitBreaker
from composition.cache.arguments import check_arguments, check_key, check_namespace
from composition.cache.coalescing import Coalescer
from composition.cache.epoch import Epoch
from composition.cache.flights import Flights
from composition.cache.invalidation import KIND_KEY, KIND_NAMESPACE, Invalidations
from composition.cache.rebuild import Call, Rebuilder
from composition.cache.results import (
    HIT,
    STALE,
    UNCACHED,
    CacheResult,
    PatternMetrics,
    namespace_of,
)
from composition.cache.serializers import Serializer
from composition.cache.store import Entry, KeySpace, LeaseStore, decode_entry, version_of
from composition.cache.uncommitted import reads_uncommitted_writes
from composition.conf import redis_client_of
from composition.errors import REDIS_ERRORS
from composition.metrics import CACHE_OPERATION_SECONDS, key_label

__all__ = ["CacheAside", "CacheResult", "namespace_of"]

log = structlog.get_logger("composition.cache")

class UnreadablePayload(Exception):
    """A cached payload this process's serializer cannot read (``CacheAside.fetch`` handles it)."""


class CacheAside:
    """Cache-aside over the django-redis cache ``alias``; see the module docstring."""

    def __init__(self, alias: str, *, serializer: Serializer, lease_ttl_s: float, lease_wait_s: float,
                 breaker_failures: int, breaker_reset_s: float, db_alias: str = DEFAULT_DB_ALIAS) -> None:
        cache: Any = caches[alias]
        self.alias = alias
        self.client: Any = redis_client_of(alias, "cache_aside")  # bytes replies (no decoding)
        self.serializer = serializer
        self.lease_wait_s = lease_wait_s
        # No trial calls: the probe closes it once Redis answers, after replaying the deferred
        # invalidations, so nothing stale is served once it closes. After the close, once more:
        # a commit refused while the probe ran (half-open) left its rows before the close, and the
        # periodic replay (which a web-only deployment does not run) would come too late.
        self.breaker = CircuitBreaker(
            f"cache:{alias}", failure_threshold=breaker_failures, reset_timeout_s=breaker_reset_s,
            probe=partial(self._replay_deferred, "replayed deferred cache invalidations", ping=True),
            after_close=self._after_close)
        self.keys = KeySpace(str(cache.make_key("composition:ca:")))
        self._flights = Flights()
        # The database loads of keys whose invalidation this process could not apply, shared only
        # with each other: any other rebuild may read Redis, whose entry and lease still hold what
        # the write replaced (a rebuild from before the write would even fill it).
        self._unapplied_loads = Flights()
        self.invalidations = Invalidations(alias, self.client, self.keys, self.breaker, db_alias=db_alias,
                                           on_applied=self._flights.detach_invalidated)
        self.store = LeaseStore(self.client)
        self.rebuilder = Rebuilder(self.store, serializer, alias=alias, lease_ttl_s=lease_ttl_s,
                                   lease_wait_s=lease_wait_s, redis_failed=self._redis_failed)
        self._execute = self.client.execute_command
        self._metrics: dict[str, PatternMetrics] = {}
        # Resolved once: observing a labelled child costs a lookup the hit path need not pay.
        self._get_seconds = CACHE_OPERATION_SECONDS.labels("get")
        self.epoch = Epoch(self.store, self.keys.epoch, alias)
        self._coalescer = Coalescer(self.store, self.breaker, lease_wait_s=lease_wait_s, loads=self._loads,
                                    uncached=self._uncached, redis_failed=self._redis_failed)

    def _after_close(self) -> None:
        self.epoch.recheck()
        self._replay_deferred("replayed cache invalidations deferred while the breaker probed")

    def peek(self, key: str) -> Any:
        """The value cached for ``key`` now (fresh or stale), or None; for tests and debugging."""
        ns_key, entry_key, _, epoch_key = self.keys.of(key)
        epoch_raw, ns_raw, raw = self.client.mget(epoch_key, ns_key, entry_key)
        entry = decode_entry(raw, version_of(epoch_raw, ns_raw))
        return None if entry is None else self.serializer.loads(entry.payload)

    def invalidate(self, key: str, *, using: str | None = None) -> None:
        """``composition.cache.invalidate`` on this alias: durable at COMMIT, replayed if not applied."""
        check_key(key)
        self.invalidations.schedule(KIND_KEY, key, using=using)

    def invalidate_namespace(self, namespace: str, *, using: str | None = None) -> None:
        check_namespace(namespace)
        self.invalidations.schedule(KIND_NAMESPACE, namespace, using=using)

    # -- reads ----------------------------------------------------------------------------------

    def fetch(self, key: str, loader: Callable[[], Any], *, ttl_s: float, jitter: float = 0.1,
              stale_ttl_s: float | None = None, pattern: str | None = None,
              early_refresh: float = 0.0) -> CacheResult:
        """The value for ``key``: cached, or ``loader()`` (see ``composition.cache.cache_aside``)."""
        check_arguments(key, ttl_s=ttl_s, jitter=jitter, stale_ttl_s=stale_ttl_s, early_refresh=early_refresh)
        if self.invalidations.invalidated_in_transaction(key):
            # Written and invalidated by the open transaction: the cache still holds what the write
            # replaces until COMMIT, and what the loader reads here is not committed (cached, a
            # rollback left it there till its TTL). The database answers; nothing is stored.
            return self._uncached(loader)
        if self.invalidations.unapplied(key) and self.breaker.state == CircuitBreaker.CLOSED:
            # This process's own invalidation of it failed after COMMIT (a Redis blip): the entry
            # may hold what the write replaced until the replay applies it, which goes first.
            # (With the breaker open, _fetch reads nothing from Redis, and its probe, which this
            # path would never start, replays the invalidations before it closes.)
            self.invalidations.catch_up()
            if self.invalidations.unapplied(key):
                metrics = self._metrics_for(pattern or key_label(key))
                call = Call(key, self.keys.of(key), loader, ttl_s, jitter, stale_ttl_s, metrics)
                return self._from_database(call, self._unapplied_loads)
        try:
            return self._fetch(key, loader, ttl_s=ttl_s, jitter=jitter, stale_ttl_s=stale_ttl_s, pattern=pattern,
                               early_refresh=early_refresh)
        except UnreadablePayload as exc:
            # Written with another serializer (CACHE_SERIALIZER changed by a deploy) or by
            # something else: every call for the key raised until its TTL. The database answers,
            # and the entry goes, so the next call fills it again.
            self._metrics_for(pattern or key_label(key)).error("unreadable_entry")
            log.warning("cache entry unreadable, loaded from the database and removed", key=key,
                        error=str(exc.__cause__))
            with contextlib.suppress(*REDIS_ERRORS):
                self._execute("DEL", self.keys.entry(key))
            return self._uncached(loader)

    def _metrics_for(self, label: str) -> PatternMetrics:
        return self._metrics.get(label) or self._metrics.setdefault(label, PatternMetrics(label))

    def _uncached(self, loader: Callable[[], Any]) -> CacheResult:
        """``loader()``'s value, not stored, in the form every caller gets (serialized and back)."""
        return CacheResult(self.serializer.loads(self.serializer.dumps(loader())), UNCACHED)

    def _fetch(self, key: str, loader: Callable[[], Any], *, ttl_s: float, jitter: float,
               stale_ttl_s: float | None, pattern: str | None, early_refresh: float) -> CacheResult:
        namespace = namespace_of(key)
        metrics = self._metrics_for(pattern or key_label(key))
        ns_key, entry_key = self.keys.namespace(namespace), self.keys.entry(key)
        if self.breaker.allow():
            epoch = self.epoch.current()
            started = time.perf_counter()
            try:
                # The hit path: this one round trip and nothing else (kept flat, it is hot).
                ns_raw, raw = self._execute("MGET", ns_key, entry_key)
            except REDIS_ERRORS as exc:
                self._get_seconds.observe(time.perf_counter() - started)
                self._redis_failed(metrics, exc)
            else:
                self._get_seconds.observe(time.perf_counter() - started)
                self.breaker.record_success()
                entry = decode_entry(raw, version_of(epoch, ns_raw))
                if entry is not None and entry[0] > time.time() * 1000 and early_refresh <= 0:
                    value = self._loads(entry[2])  # raises for an unreadable entry: not a hit
                    metrics.hits.inc()
                    return CacheResult(value, HIT)
                call = Call(key, self.keys.of(key), loader, ttl_s, jitter, stale_ttl_s, metrics)
                return self._slow_path(call, entry, early_refresh)
        else:
            metrics.error("breaker_open")
        return self._from_database(Call(key, self.keys.of(key), loader, ttl_s, jitter, stale_ttl_s, metrics))

    def _from_database(self, call: Call, flights: Flights | None = None) -> CacheResult:
        """The loader's value with Redis out of the way, one load at a time per key among
        ``flights`` (by default every rebuild's; a read joins only a load that began after it,
        ``Coalescer.coalesce``); a transaction that has written loads alone, since other threads
        cannot see what it reads."""
        if reads_uncommitted_writes():
            return self._uncached(call.loader)
        return self._coalescer.coalesce(call, None, partial(self.rebuilder.degraded, call), flights or self._flights)

    def _slow_path(self, call: Call, entry: Entry | None, early_refresh: float) -> CacheResult:
        """A miss, a stale entry, or a fresh entry that early refresh picked for rebuilding."""
        metrics = call.metrics
        stale_ttl_s = call.stale_ttl_s
        now_ms = time.time() * 1000
        fallback: CacheResult | None = None
        if entry is not None and entry.fresh_until_ms > now_ms:
            # No early refresh from a transaction that has written: what it reads may not commit.
            if not self._refresh_early(entry, now_ms, early_refresh) or reads_uncommitted_writes():
                value = self._loads(entry.payload)  # raises for an unreadable entry: not a hit
                metrics.hits.inc()
                return CacheResult(value, HIT)
            metrics.hits.inc()  # a hit either way
            fallback = CacheResult(entry.payload, HIT)
        else:
            metrics.misses.inc()
            if reads_uncommitted_writes():
                # Cached, a ROLLBACK would leave it there till its TTL; shared, other threads
                # would read what they cannot see.
                return self._uncached(call.loader)
            if entry is not None and stale_ttl_s and now_ms < entry.fresh_until_ms + stale_ttl_s * 1000:
                fallback = CacheResult(entry.payload, STALE)
        return self._coalescer.coalesce(call, fallback, partial(self.rebuilder.rebuild, call, fallback),
                                        self._flights)

    @staticmethod
    def _refresh_early(entry: Entry, now_ms: float, beta: float) -> bool:
        if beta <= 0:
            return False
        # XFetch (Vattani et al.): refresh with a probability that grows as expiry nears, scaled
        # by how long the last rebuild took, so one caller refreshes before everyone misses.
        gap_ms = -entry.rebuild_ms * beta * math.log(1.0 - random.random())
        return now_ms + gap_ms >= entry.fresh_until_ms

    def _loads(self, payload: bytes) -> Any:
        try:
            return self.serializer.loads(payload)
        except Exception as exc:
            raise UnreadablePayload from exc

    def _redis_failed(self, metrics: PatternMetrics | None, exc: BaseException) -> None:
        self.breaker.record_failure()
        if metrics is not None:
            metrics.error("redis_error")
        log.warning("cache redis call failed", alias=self.alias, error=str(exc))

    def _replay_deferred(self, event: str, *, ping: bool = False) -> None:
        try:
            if ping:
                self.client.ping()
            replayed = self.invalidations.replay_pending()
            if replayed:
                log.info(event, alias=self.alias, count=replayed)
        finally:
            connections.close_all()  # the probe thread's own connections
