"""The pressure signals the shedding controller reads, each measured now, on each broker.

- ``oldest_wait_s``: how long the oldest ready message of an essential queue has waited (the
  largest over them); Redis only: RabbitMQ cannot tell a queue head's age without consuming it.
- ``ready_messages``: messages ready on the broker for an essential queue (the largest over
  them); a passive declare on RabbitMQ, a list length on Redis: RabbitMQ's signal.
- ``db_latency_ms``: the round trip of ``SELECT 1`` on this thread's connection.

A signal that cannot be measured (the broker or the database does not answer, or the broker
cannot tell) reads None: never calm, never over.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.db import connection
from dramatiq.broker import Broker

from composition.backpressure.depth import broker_counts
from composition.sampling.queues import oldest_ready_age_s

__all__ = ["SIGNALS", "Reading", "read_pressure"]

SIGNALS = ("oldest_wait_s", "ready_messages", "db_latency_ms")


@dataclass(frozen=True)
class Reading:
    signal: str
    value: float | None  # None: could not be measured
    limit: float
    where: str = ""  # the essential queue the value is from, for the reason text

    @property
    def over(self) -> bool:
        return self.value is not None and self.value >= self.limit

    def calm(self, share: float) -> bool:
        """Below ``share`` of its limit (an unmeasured signal is not calm)."""
        return self.value is not None and self.value < self.limit * share

    def describe(self) -> str:
        unit = {"oldest_wait_s": " s", "db_latency_ms": " ms"}.get(self.signal, "")
        digits = 0 if self.signal == "ready_messages" else 1
        shown = "unmeasured" if self.value is None else f"{self.value:.{digits}f}{unit}"
        where = f" of {self.where}" if self.where else ""
        return f"{self.signal}{where} {shown} (limit {self.limit:g}{unit})"


def _largest(values: Mapping[str, float | None]) -> tuple[float | None, str]:
    if not values:
        return 0.0, ""  # no essential queue to wait in: nothing waits
    if any(value is None for value in values.values()):
        return None, ""
    queue = max(values, key=lambda name: values[name] or 0.0)
    return values[queue], queue


def _per_queue(broker: Broker, queues: Sequence[str], read: str) -> dict[str, float | None]:
    values: dict[str, float | None] = {}
    for queue in queues:
        try:
            if read == "oldest_wait_s":
                values[queue] = oldest_ready_age_s(broker, queue)
            else:
                values[queue] = float(broker_counts(queue, broker).ready)
        except Exception:  # the broker does not answer: unmeasured, and the rest not asked
            values[queue] = None
            break
    return values


def _db_latency_ms() -> float | None:
    began = time.perf_counter()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception:
        return None
    return (time.perf_counter() - began) * 1000


def read_pressure(broker: Broker, essential: Sequence[str], limits: Mapping[str, float | None],
                  resumed_at: Mapping[str, float] | None = None) -> list[Reading]:
    """One reading per signal whose limit is set, in ``SIGNALS`` order. A queue in ``resumed_at``
    (name → Unix time of its last resume) has waited at most since then: the time its messages
    spent paused was an operator's choice, not pressure."""
    readings = []
    for signal in SIGNALS:
        limit = limits.get(signal)
        if limit is None:
            continue
        if signal == "oldest_wait_s" and getattr(broker, "client", None) is None:
            continue  # not a Redis broker: it cannot be measured there (check W131 says so)
        if signal == "db_latency_ms":
            readings.append(Reading(signal, _db_latency_ms(), float(limit)))
            continue
        values = _per_queue(broker, essential, signal)
        if signal == "oldest_wait_s":
            now = time.time()
            values = {queue: value if value is None or queue not in (resumed_at or {})
                      else min(value, max(0.0, now - (resumed_at or {})[queue])) for queue, value in values.items()}
        value, where = _largest(values)
        readings.append(Reading(signal, value, float(limit), where))
    return readings
