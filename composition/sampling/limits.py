"""Each limited job's limits and how the cluster stands against them (``sample_limits``), for
the gauges, the operations page and ``queues limits``."""

from __future__ import annotations

from dataclasses import dataclass

from dramatiq.broker import Broker

from composition.errors import REDIS_ERRORS, described
from composition.limits import JobLimits, LimitState, limit_store

__all__ = ["LimitSample", "limited_jobs", "sample_limits"]


@dataclass(frozen=True)
class LimitSample:
    actor: str
    queue: str
    limits: JobLimits
    state: LimitState | None  # None when the limits' Redis could not be asked
    error: str | None = None


def limited_jobs(broker: Broker) -> dict[str, tuple[str, JobLimits]]:
    """Job name → (its queue, its limits), for every job declared with a limit."""
    found = {}
    for name, actor in broker.actors.items():
        limits = actor.options.get("job_limits")
        if isinstance(limits, JobLimits) and name == actor.actor_name:  # an alias is no job of its own
            found[name] = (actor.queue_name, limits)
    return dict(sorted(found.items()))


def sample_limits(broker: Broker) -> list[LimitSample]:
    """One script call per limited job; an unreachable Redis is in each sample, not raised."""
    samples = []
    for actor, (queue, limits) in limited_jobs(broker).items():
        try:
            samples.append(LimitSample(actor, queue, limits, limit_store().state(actor, limits)))
        except REDIS_ERRORS as exc:
            samples.append(LimitSample(actor, queue, limits, None, described(exc)))
    return samples
