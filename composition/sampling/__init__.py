"""What no single call can count, sampled by ``runworkers`` every ``METRICS_SAMPLE_INTERVAL_S``.

The package reads like its parts: ``database`` (connections in use by state against the
server's limit, from ``pg_stat_activity``; deadlocks, from ``pg_stat_database``), ``queues``
(each declared queue's depth, its broker counts and, on Redis, the age of its oldest ready
message; open dead letters per actor) and ``component`` (the periodic component that samples
and sets the gauges of ``composition.metrics``).

Each sampler is a plain function that reads and returns a value, with no side effect, so the
operations page, a command or a test can call it too; only the component writes gauges.
"""

from __future__ import annotations

from composition.sampling.component import MetricsSamplerComponent, Sample
from composition.sampling.database import CONNECTION_STATES, DatabaseSample, sample_database
from composition.sampling.queues import (
    QueueSample,
    declared_queues,
    oldest_ready_age_s,
    open_dead_letters_by_actor,
    sample_queues,
)

__all__ = [
    "CONNECTION_STATES",
    "DatabaseSample",
    "MetricsSamplerComponent",
    "QueueSample",
    "Sample",
    "declared_queues",
    "oldest_ready_age_s",
    "open_dead_letters_by_actor",
    "sample_database",
    "sample_queues",
]
