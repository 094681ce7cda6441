"""Limits a job declares across the whole cluster: ``@job(concurrency=N)``, at most N runs at
once; ``@job(rate="100/10s")``, at most 100 starts in any 10 s of the Redis server's clock.

``declared`` (``JobLimits``, ``Rate``: what ``@job`` was given), ``store`` (the state on the
cache's Redis and the scripts that change it), ``leases`` (the slots this process holds and
``SlotRenewer``, which keeps them while their jobs run). The worker side is the
``LimitedStarts`` middleware (``composition.jobs.middleware.limited_starts``). See docs/limits.md.
"""

from composition.limits.declared import JobLimits, Rate
from composition.limits.leases import SlotRenewer, held_slots
from composition.limits.store import Admission, LimitState, LimitStore, limit_store

__all__ = ["Admission", "JobLimits", "LimitState", "LimitStore", "Rate", "SlotRenewer", "held_slots",
           "limit_store"]
