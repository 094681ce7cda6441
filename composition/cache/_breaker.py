"""A small private circuit breaker for the cache's Redis (to be swapped for
composition.backpressure.CircuitBreaker once that exists).

Closed: calls go through; ``failure_threshold`` consecutive failures open it. Open: ``allow()``
answers False at once, so a dead Redis costs callers nothing. After ``reset_timeout_s`` one
background probe runs (callers never wait for it); when the probe succeeds, the breaker closes.
The probe is the place to do recovery work that must precede serving from Redis again (the
cache replays deferred invalidations there).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

log = structlog.get_logger("composition.cache")


class _Breaker:
    def __init__(self, name: str, *, failure_threshold: int, reset_timeout_s: float,
                 probe: Callable[[], None]) -> None:
        self.name = name
        self.failure_threshold = failure_threshold
        self.reset_timeout_s = reset_timeout_s
        self._probe = probe
        self._lock = threading.Lock()
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False

    @property
    def is_open(self) -> bool:
        return self._opened_at is not None

    def allow(self) -> bool:
        """True when a call may use Redis. Lock-free while closed: this is on every hit."""
        opened_at = self._opened_at
        if opened_at is None:
            return True
        if not self._probing and time.monotonic() - opened_at >= self.reset_timeout_s:
            self._start_probe()
        return False

    def success(self) -> None:
        if self._failures:
            self._failures = 0

    def failure(self) -> None:
        with self._lock:
            self._failures += 1
            if self._opened_at is None and self._failures >= self.failure_threshold:
                self._opened_at = time.monotonic()
                log.warning("cache circuit opened", breaker=self.name, failures=self._failures)

    def _start_probe(self) -> None:
        with self._lock:
            if self._probing or self._opened_at is None:
                return
            self._probing = True
        threading.Thread(target=self._run_probe, name=f"breaker-probe-{self.name}", daemon=True).start()

    def _run_probe(self) -> None:
        try:
            self._probe()
        except Exception as exc:
            with self._lock:
                self._opened_at = time.monotonic()
            log.info("cache circuit probe failed", breaker=self.name, error=str(exc))
        else:
            with self._lock:
                self._opened_at = None
                self._failures = 0
            log.info("cache circuit closed", breaker=self.name)
        finally:
            self._probing = False
