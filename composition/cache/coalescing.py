"""Who waits: one load per key among a ``Flights`` (``composition.cache.flights``); the other
threads asking for that key meanwhile take its value, serve their fallback (a stale value, or the
fresh one an early refresh replaces), or wait.

What a changer must keep: a thread takes another's value only from a read that began after it
did, or from a load under a lease that still stands in Redis; any other value may predate a
write the thread must see.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from composition.breaker import CircuitBreaker
from composition.cache.flights import Flight, Flights, tick
from composition.cache.rebuild import Call
from composition.cache.results import COALESCED, STALE, CacheResult, PatternMetrics
from composition.cache.store import LeaseStore
from composition.errors import REDIS_ERRORS

__all__ = ["Coalescer"]


class Coalescer:
    """The waiting of one cache alias's callers. ``loads`` decodes a payload (raising for one this
    process cannot read), ``uncached`` runs a loader for a value not stored, and
    ``redis_failed(metrics, exc)`` is told of every Redis error."""

    def __init__(self, store: LeaseStore, breaker: CircuitBreaker, *, lease_wait_s: float,
                 loads: Callable[[bytes], Any], uncached: Callable[[Callable[[], Any]], CacheResult],
                 redis_failed: Callable[[PatternMetrics | None, BaseException], None]) -> None:
        self.store = store
        self.breaker = breaker
        self.lease_wait_s = lease_wait_s
        self._loads = loads
        self._uncached = uncached
        self._redis_failed = redis_failed

    def coalesce(self, call: Call, fallback: CacheResult | None,
                 produce: Callable[[Flight], CacheResult], flights: Flights) -> CacheResult:
        """Run ``produce`` once per key among ``flights``; other threads share its payload, or take
        ``fallback`` (the stale value, or the fresh one an early refresh replaces) at once.

        A thread takes the payload only of a read that began after it did, or of a load under a
        lease that still stands: a value read before a write that ended before this call began
        (a leader's ACQUIRE that found the old entry, or its database read while Redis is down)
        is the old value. Such a flight is waited out and the next one joined: the readers that
        came during one load share the next, each waiting up to ``lease_wait_s`` for either."""
        began = tick()
        flight, leader = flights.join(call.key)
        if not leader and fallback is not None:
            return self._serve(fallback, call.metrics)
        if not leader:
            call.metrics.coalesced.inc()
        arrived = True
        while not leader:
            # Only the flight found on arrival can have begun its read before this call: a later
            # one replaced it, so it began after.
            lease_stands = self._lease_stands(flight, call) if arrived else None
            if lease_stands is False:
                flight, leader, arrived = *flights.leave(call.key, flight), False
                continue
            # Raises the leader's exception here; None as long as another process waits for the lease.
            payload = flight.wait(self.lease_wait_s)
            if payload is None:
                call.metrics.error("lease_wait_timeout")
                return self._uncached(call.loader)
            if lease_stands or flight.read_at > began:
                return CacheResult(self._loads(payload), COALESCED)
            if not arrived:
                # Its leader served its own earlier lookup (a stale value): not a third flight.
                return self._uncached(call.loader)
            flight, leader, arrived = *flights.leave(call.key, flight), False
        try:
            result = produce(flight)
        except BaseException as exc:
            flights.land(call.key, flight, error=exc)
            raise
        flights.land(call.key, flight, payload=result.value)
        return CacheResult(self._loads(result.value), result.outcome)

    def _lease_stands(self, flight: Flight, call: Call) -> bool | None:
        """Whether the lease ``flight``'s leader rebuilds under still stands in Redis: False when
        another process's invalidation revoked it (the leader may have read the data before that
        write; its fill will be refused), None when it holds none yet or Redis is not asked (its
        breaker open) or does not answer: then when its read began decides."""
        if flight.lease is None or self.breaker.is_open:
            return None
        try:
            return bool(self.store.holds(call.keys, *flight.lease))
        except REDIS_ERRORS as exc:
            self._redis_failed(call.metrics, exc)
            return None

    def _serve(self, fallback: CacheResult, metrics: PatternMetrics) -> CacheResult:
        if fallback.outcome == STALE:
            metrics.stale.inc()
        return CacheResult(self._loads(fallback.value), fallback.outcome)
