"""What no single call can count, sampled by ``runworkers`` every ``METRICS_SAMPLE_INTERVAL_S``.

Modules: ``database`` (connections by state, deadlocks), ``queues`` (depths, broker counts, the
oldest message's age, open dead letters), ``limits`` (each limited job's slots and starts),
``invalidations`` (cache invalidations waiting for the replay) and ``component`` (the periodic
component that sets the gauges). Each sampler only reads and returns a value, so the operations
page, a command or a test can call it too; only the component writes gauges.
"""

from __future__ import annotations

from composition.sampling.component import MetricsSamplerComponent, Sample
from composition.sampling.database import CONNECTION_STATES, DatabaseSample, sample_database
from composition.sampling.invalidations import PendingInvalidations, sample_pending_invalidations
from composition.sampling.limits import LimitSample, limited_jobs, sample_limits
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
    "LimitSample",
    "MetricsSamplerComponent",
    "PendingInvalidations",
    "QueueSample",
    "Sample",
    "declared_queues",
    "limited_jobs",
    "oldest_ready_age_s",
    "open_dead_letters_by_actor",
    "sample_database",
    "sample_limits",
    "sample_pending_invalidations",
    "sample_queues",
]
