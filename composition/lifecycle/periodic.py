"""One background loop for components whose work is a round repeated every few seconds."""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

import structlog
from django.db import connections

from composition.conf import conf
from composition.errors import described

__all__ = ["REPEATED_FAILURE_WARNING_S", "PeriodicComponent", "RepeatedFailures"]

log = structlog.get_logger("composition.lifecycle")

# A failure identical to the round before's is logged at debug, and at warning again once this
# long has passed: an outage of minutes says so a few times, not once per round.
REPEATED_FAILURE_WARNING_S = 60.0


class RepeatedFailures:
    """Says a run of failures of one thing (a loop's rounds, one schedule's) as ``event`` on
    ``logger``: at warning when the error is new or was last said ``REPEATED_FAILURE_WARNING_S``
    ago, at debug otherwise; then, at the first success, "rounds succeed again" once."""

    def __init__(self, logger: Any, event: str, **fields: Any) -> None:
        self.logger, self.event, self.fields = logger, event, fields
        self.count = 0  # failures in a row
        self.last_error: str | None = None
        self._warned_at = 0.0

    def failed(self, error: str) -> None:
        self.count += 1
        now = time.monotonic()
        if error != self.last_error or now - self._warned_at >= REPEATED_FAILURE_WARNING_S:
            self.logger.warning(self.event, error=error, failed_rounds=self.count, **self.fields)
            self._warned_at = now
        else:
            self.logger.debug(self.event, error=error, failed_rounds=self.count, **self.fields)
        self.last_error = error

    def succeeded(self) -> None:
        if self.count:
            self.logger.info("rounds succeed again", failed_rounds=self.count, last_error=self.last_error,
                             **self.fields)
        self.count, self.last_error = 0, None


class PeriodicComponent:
    """A component that runs ``tick()`` on a daemon thread every ``interval_s`` until stopped.

    A subclass sets ``name`` (and ``depends_on``) and implements ``tick()``; ``tick()`` returning
    True means work was left over: the next round starts at once (a stop is still noticed in
    between) instead of after ``interval_s``. A round that raises is logged as
    ``failure_event`` on ``logger`` and the loop carries on; the same failure again is logged at
    debug (at warning once every ``REPEATED_FAILURE_WARNING_S``, with the count), and the first
    round to succeed after failures says so; ``failed_rounds`` counts the failures in a row, for a
    subclass whose ``interval_s`` backs off. The thread closes its database
    connections when it ends. Class attributes tune the rest:

    - ``interval_setting``: the ``COMPOSITION`` key read at every wait when no ``interval_s``
      was passed, so a changed setting takes effect at the next round;
    - ``thread_name``: the thread's name (default ``name``);
    - ``tick_at_start``: True runs the first round as soon as the thread starts, False waits one
      interval first;
    - ``stop_on_drain``: True ends the loop at ``begin_drain`` (intake stops with the rest),
      False keeps it running until ``stop``.
    """

    name: str
    interval_setting: ClassVar[str | None] = None
    thread_name: ClassVar[str | None] = None
    tick_at_start: ClassVar[bool] = True
    stop_on_drain: ClassVar[bool] = True
    failure_event: ClassVar[str] = "background round failed"
    logger: ClassVar[Any] = log

    def __init__(self, *, interval_s: float | None = None) -> None:
        self._interval_s = interval_s
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = RepeatedFailures(self.logger, self.failure_event, component=self.name)

    @property
    def failed_rounds(self) -> int:
        """Rounds failed in a row."""
        return self._failures.count

    @property
    def interval_s(self) -> float:
        """Seconds between rounds: as passed in, else the ``interval_setting`` key."""
        if self._interval_s is not None:
            return self._interval_s
        if self.interval_setting is None:
            raise TypeError(f"{type(self).__name__} needs interval_s or an interval_setting")
        return float(getattr(conf, self.interval_setting))

    def tick(self) -> bool | None:
        """One round of work; True to go again at once."""
        raise NotImplementedError

    def stopping(self) -> bool:
        """True once a drain or stop was asked for; a long round checks it between steps."""
        return self._stop_event.is_set()

    def start(self) -> None:
        self._stop_event.clear()
        thread = threading.Thread(target=self._loop, name=self.thread_name or self.name, daemon=True)
        thread.start()
        self._thread = thread  # once started: a thread the host refused cannot be joined

    def _loop(self) -> None:
        try:
            wait_s = 0.0 if self.tick_at_start else self.interval_s
            while not self._stop_event.wait(wait_s):
                wait_s = 0.0 if self._guarded_tick() else self.interval_s
        finally:
            # Only this thread's connections: a background thread must not leave one open.
            connections.close_all()

    def _guarded_tick(self) -> bool:
        try:
            more = self.tick() is True
        except Exception as exc:  # a database or broker blip must not end the loop
            self._failures.failed(described(exc))
            return False
        self._failures.succeeded()
        return more

    def alive(self) -> bool:
        """False only when the thread ended without being asked to."""
        return self._thread is None or self._thread.is_alive() or self._stop_event.is_set()

    def begin_drain(self) -> None:
        if self.stop_on_drain:
            self._stop_event.set()

    def stop(self, timeout_s: float) -> None:
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
