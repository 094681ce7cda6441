"""``MetricsSamplerComponent``: runworkers' periodic sampling, and the only writer of the gauges
that the samplers' values feed; each round's readings also go to ``on_sample`` (runworkers
records the queues' history there: ``composition.queues.history``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
from django.db import DEFAULT_DB_ALIAS, close_old_connections
from dramatiq.broker import Broker
from prometheus_client import Gauge

from composition.conf import conf
from composition.errors import described
from composition.lifecycle.periodic import PeriodicComponent
from composition.metrics import (
    BROKER_MESSAGES,
    BROKER_OLDEST_MESSAGE_AGE_SECONDS,
    BROKER_READ_TIMESTAMP,
    CACHE_INVALIDATION_OLDEST_PENDING_AGE_SECONDS,
    CACHE_INVALIDATIONS_PENDING,
    DB_CONNECTION_BUDGET,
    DB_CONNECTIONS_IN_USE,
    DB_CONNECTIONS_MAX,
    DB_DEADLOCKS_DETECTED,
    DEAD_LETTERS_OPEN,
    JOB_LIMIT,
    JOB_LIMIT_SLOTS_HELD,
    QUEUE_DEPTH,
)
from composition.sampling.database import DatabaseSample, sample_database
from composition.sampling.invalidations import PendingInvalidations, sample_pending_invalidations
from composition.sampling.limits import LimitSample, sample_limits
from composition.sampling.queues import QueueSample, open_dead_letters_by_actor, sample_queues

__all__ = ["MetricsSamplerComponent", "Sample"]

log = structlog.get_logger("composition.metrics")


@dataclass
class Sample:
    """One round's readings; a part that failed is None and its error is in ``errors``."""

    database: DatabaseSample | None = None
    queues: list[QueueSample] | None = None
    dead_letters: dict[str, int] | None = None
    invalidations: dict[str, PendingInvalidations] | None = None
    limits: list[LimitSample] | None = None
    errors: dict[str, str] = field(default_factory=dict)


class MetricsSamplerComponent(PeriodicComponent):
    """Samples the database, the queues, the dead letters, the pending cache invalidations and the
    job limits at start and then every ``interval_s`` (default ``METRICS_SAMPLE_INTERVAL_S``) on
    a thread that holds one database
    connection, and sets the gauges. ``connection_budget`` is this process's share of the
    ``manage.py system`` budget (``composition.db.budget.connections_per_process``), exported as is.

    One failing source (a broker outage) leaves the others' gauges fresh; it is logged. A label
    that disappears (a queue emptied of dead letters) is set to 0, not left at its last value:
    a multiprocess gauge cannot be removed, and a stale value would keep an alert firing.
    """

    name = "metrics-sampler"
    depends_on = ("database", "broker")
    interval_setting = "METRICS_SAMPLE_INTERVAL_S"
    failure_event = "metrics sampling failed"
    logger = log

    def __init__(self, broker: Broker, *, connection_budget: int, interval_s: float | None = None,
                 alias: str = DEFAULT_DB_ALIAS, on_sample: Callable[[Sample], None] | None = None) -> None:
        super().__init__(interval_s=interval_s)
        self.broker = broker
        self.connection_budget = connection_budget
        self.alias = alias
        self._labels_set: dict[Gauge, set[tuple[str, ...]]] = {}
        self._read_queues: set[str] = set()
        self.on_sample = on_sample

    def start(self) -> None:
        DB_CONNECTION_BUDGET.labels("worker").set(self.connection_budget)
        # From now: a broker down from the start is unread from the start (BrokerUnread).
        started_at = time.time()
        for queue in self.broker.get_declared_queues():
            BROKER_READ_TIMESTAMP.labels(queue).set(started_at)
            self._read_queues.add(queue)
        super().start()

    def tick(self) -> None:
        close_old_connections()
        sample = self.sample()
        if self.on_sample is not None:
            self.on_sample(sample)

    def sample(self) -> Sample:
        """One round on the calling thread: read every source, set the gauges, return the readings."""
        sample = Sample()
        try:
            sample.database = sample_database(self.alias)
        except Exception as exc:
            sample.errors["database"] = described(exc)
        try:
            sample.dead_letters = open_dead_letters_by_actor()
        except Exception as exc:
            sample.errors["dead_letters"] = described(exc)
        try:
            sample.invalidations = sample_pending_invalidations(self.alias)
        except Exception as exc:
            sample.errors["invalidations"] = described(exc)
        try:
            sample.queues = sample_queues(self.broker)  # broker errors are per queue, in the sample
        except Exception as exc:
            sample.errors["queues"] = described(exc)
        sample.limits = sample_limits(self.broker)  # a Redis error is per job, in the sample
        for limit in sample.limits:
            if limit.error is not None:
                sample.errors[f"limits:{limit.actor}"] = limit.error
        for queue in sample.queues or ():
            if queue.error is not None:
                sample.errors[f"broker:{queue.queue}"] = queue.error
        self._publish(sample)
        if sample.errors:
            log.warning("metrics sampling incomplete", errors=sample.errors)
        return sample

    def _publish(self, sample: Sample) -> None:
        if sample.database is not None:
            for state, count in sample.database.connections.items():
                DB_CONNECTIONS_IN_USE.labels(state).set(count)
            DB_CONNECTIONS_MAX.set(sample.database.usable)
            DB_DEADLOCKS_DETECTED.set(sample.database.deadlocks)
        if sample.dead_letters is not None:
            self._set_all(DEAD_LETTERS_OPEN, {(actor,): count for actor, count in sample.dead_letters.items()})
        if sample.invalidations is not None:
            # The configured cache is always reported, at 0 when nothing waits.
            waiting = {conf.CACHE_ALIAS: PendingInvalidations(0, 0.0), **sample.invalidations}
            self._set_all(CACHE_INVALIDATIONS_PENDING, {(cache,): pending.rows for cache, pending in waiting.items()})
            self._set_all(CACHE_INVALIDATION_OLDEST_PENDING_AGE_SECONDS,
                          {(cache,): pending.oldest_age_s for cache, pending in waiting.items()})
        for limit in sample.limits or ():
            if limit.limits.concurrency is not None:
                JOB_LIMIT.labels(limit.actor, "concurrency").set(limit.limits.concurrency)
                if limit.state is not None:
                    JOB_LIMIT_SLOTS_HELD.labels(limit.actor).set(limit.state.slots_held)
            if limit.limits.rate is not None:
                JOB_LIMIT.labels(limit.actor, "rate").set(limit.limits.rate.starts / limit.limits.rate.window_s)
        if sample.queues is None:
            return
        depths: dict[tuple[str, ...], float] = {}
        messages: dict[tuple[str, ...], float] = {}
        ages: dict[tuple[str, ...], float] = {}
        read_at = time.time()
        # A queue sampled before and not now (its outbox rows relayed, never declared) has nothing
        # left to read: not unread.
        for queue_name in self._read_queues - {queue.queue for queue in sample.queues}:
            BROKER_READ_TIMESTAMP.labels(queue_name).set(read_at)
        for queue in sample.queues:
            self._read_queues.add(queue.queue)
            if queue.broker is None:
                continue
            BROKER_READ_TIMESTAMP.labels(queue.queue).set(read_at)
            depths[(queue.queue,)] = queue.depth
            messages[(queue.queue, "ready")] = queue.broker.ready
            messages[(queue.queue, "delayed")] = queue.broker.delayed
            if queue.broker.in_flight is not None:
                messages[(queue.queue, "in_flight")] = queue.broker.in_flight
            if queue.oldest_age_s is not None:
                ages[(queue.queue,)] = queue.oldest_age_s
        unknown = frozenset(queue.queue for queue in sample.queues if queue.broker is None)
        self._set_all(QUEUE_DEPTH, depths, unknown=unknown)
        self._set_all(BROKER_MESSAGES, messages, unknown=unknown)
        self._set_all(BROKER_OLDEST_MESSAGE_AGE_SECONDS, ages, unknown=unknown)

    def _set_all(self, gauge: Gauge, values: dict[tuple[str, ...], float], *,
                 unknown: frozenset[str] = frozenset()) -> None:
        """Set ``values``, and 0 for the labels set in an earlier round and absent now, except a
        queue in ``unknown`` (its broker could not be asked): it keeps its last reading, not a false 0."""
        previous = self._labels_set.get(gauge, set())
        kept = {labels for labels in previous if labels[0] in unknown}
        for labels in previous - values.keys() - kept:
            gauge.labels(*labels).set(0)
        for labels, value in values.items():
            gauge.labels(*labels).set(value)
        self._labels_set[gauge] = set(values) | kept
