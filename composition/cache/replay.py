"""A component that replays recorded cache invalidations periodically.

The breaker of a process that saw the outage replays before it closes; this covers the processes
that never noticed it (their Redis calls kept working, or they were idle) and invalidations left
by a process that died after committing them, before Redis applied them.
"""

from __future__ import annotations

import threading

import structlog
from django.db import connections

__all__ = ["InvalidationReplayComponent"]

log = structlog.get_logger("composition.cache")


class InvalidationReplayComponent:
    """Every ``interval_s`` (default ``CACHE_REPLAY_INTERVAL_S``) apply recorded invalidations of
    cache ``alias`` that Redis has not applied. Several processes may run it at once (rows are
    claimed with SKIP LOCKED). Failures are logged and retried at the next tick."""

    name = "cache-invalidation-replay"
    depends_on = ("database", "cache")

    def __init__(self, *, interval_s: float | None = None, alias: str | None = None) -> None:
        self.interval_s = interval_s
        self.alias = alias
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        from composition.conf import conf

        interval_s = self.interval_s if self.interval_s is not None else float(conf.CACHE_REPLAY_INTERVAL_S)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), name=self.name, daemon=True)
        self._thread.start()

    def run_once(self) -> int:
        from composition.cache import get_cache_aside

        return get_cache_aside(self.alias).invalidations.replay_pending()

    def _loop(self, interval_s: float) -> None:
        try:
            while not self._stop.wait(interval_s):
                try:
                    count = self.run_once()
                    if count:
                        log.info("replayed deferred cache invalidations", count=count)
                except Exception as exc:
                    log.warning("deferred cache invalidation replay failed", error=str(exc))
        finally:
            connections.close_all()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
