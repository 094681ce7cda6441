"""A component that replays recorded cache invalidations periodically.

The breaker of a process that saw the outage replays before it closes; this covers the processes
that never noticed it (their Redis calls kept working, or they were idle) and invalidations left
by a process that died after committing them, before Redis applied them.
"""

from __future__ import annotations

import structlog

from composition.cache.handler import get_cache_aside
from composition.lifecycle.periodic import PeriodicComponent

__all__ = ["InvalidationReplayComponent"]

log = structlog.get_logger("composition.cache")


class InvalidationReplayComponent(PeriodicComponent):
    """Every ``interval_s`` (default ``CACHE_REPLAY_INTERVAL_S``) apply recorded invalidations of
    cache ``alias`` that Redis has not applied. Several processes may run it at once (rows are
    claimed with SKIP LOCKED). Failures are logged and retried at the next round."""

    name = "cache-invalidation-replay"
    depends_on = ("database", "cache")
    interval_setting = "CACHE_REPLAY_INTERVAL_S"
    tick_at_start = False
    # Invalidations committed by in-flight jobs during a drain still get replayed.
    stop_on_drain = False
    failure_event = "deferred cache invalidation replay failed"
    logger = log

    def __init__(self, *, interval_s: float | None = None, alias: str | None = None) -> None:
        super().__init__(interval_s=interval_s)
        self.alias = alias

    def run_once(self) -> int:
        return get_cache_aside(self.alias).invalidations.replay_pending()

    def tick(self) -> None:
        count = self.run_once()
        if count:
            log.info("replayed deferred cache invalidations", count=count)
