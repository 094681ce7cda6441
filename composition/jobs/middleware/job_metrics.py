"""``JobMetrics`` counts and times each run by outcome (success, retry, dead) and logs it; it runs
before the dead letter is written, so the ``dead`` count never trails a visible dead letter.
``explained()`` gives a ``TimeLimitExceeded`` a message naming the limit."""

from __future__ import annotations

import logging
import time
from typing import Any

import structlog
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Middleware, Shutdown

from composition.broker.time_limits import TimeLimitExceeded
from composition.errors import described
from composition.jobs.middleware.in_flight import InFlight, InFlightRegistry
from composition.jobs.middleware.retries import BACKOFF_OPTION
from composition.metrics import (
    DEAD_LETTER_RECORD_FAILURES_TOTAL,
    DEAD_LETTER_RECORD_OUTCOMES,
    DEAD_LETTERS_TOTAL,
    JOB_DURATION_SECONDS,
    JOB_OUTCOMES,
    JOB_TIMEOUTS_TOTAL,
    JOBS_TOTAL,
    LabelledChildren,
)

__all__ = ["JobMetrics", "explained"]

log = structlog.get_logger("composition.jobs")
# The standard-library logger under ``log``: its level decides whether a debug line is built at all
# (structlog's filter_by_level asks the same logger, after building the event).
_stdlib_log = logging.getLogger("composition.jobs")


def explained(exception: BaseException, job: InFlight | None) -> BaseException:
    """``exception``, or for a time-out the same class with a message naming the limit (and the
    original traceback)."""
    if not isinstance(exception, TimeLimitExceeded):
        return exception
    limit = f"{job.time_limit_s:g}s" if job and job.time_limit_s else "its time limit"
    return TimeLimitExceeded(f"job ran longer than {limit} and was interrupted").with_traceback(
        exception.__traceback__)


class JobMetrics(Middleware):
    """Outcome counts, durations, time-outs and outcome logs per run (see module doc)."""

    def __init__(self, in_flight: InFlightRegistry) -> None:
        self.in_flight = in_flight
        self._durations = LabelledChildren(JOB_DURATION_SECONDS)
        self._runs = LabelledChildren(JOBS_TOTAL)

    def after_process_boot(self, broker: Broker) -> None:
        """Every counter a worker moves, at 0 for each declared actor: a series first seen at 1
        has no ``increase()`` in Prometheus (one sample), so the first dead letter of an actor
        after a start would not fire an alert on ``increase(composition_dead_letters_total)``."""
        for actor in broker.get_declared_actors():
            for outcome in JOB_OUTCOMES:
                JOBS_TOTAL.labels(actor, outcome)
            JOB_TIMEOUTS_TOTAL.labels(actor)
            DEAD_LETTERS_TOTAL.labels(actor)
            for outcome in DEAD_LETTER_RECORD_OUTCOMES:
                DEAD_LETTER_RECORD_FAILURES_TOTAL.labels(actor, outcome)

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        if exception is None and message.failed:
            return  # failed by a middleware before it ran: no run to count
        actor_name = message.actor_name
        job = self.in_flight.finished(message)
        took_s = time.monotonic() - job.started_monotonic if job else 0.0
        self._durations(actor_name).observe(took_s)
        if exception is None:
            self._runs(actor_name, "success").inc()
            if _stdlib_log.isEnabledFor(logging.DEBUG):
                log.debug("job succeeded", duration_s=round(took_s, 4))
            return
        if isinstance(exception, TimeLimitExceeded):
            JOB_TIMEOUTS_TOTAL.labels(actor_name).inc()
            log.warning("job exceeded its time limit", time_limit_s=job.time_limit_s if job else None,
                        duration_s=round(took_s, 4))
        if isinstance(exception, Shutdown):
            self._runs(actor_name, "retry").inc()
            log.warning("job interrupted by shutdown, requeued without using an attempt")
            return
        if not message.failed:
            self._runs(actor_name, "retry").inc()
            log.warning("job failed, will retry", error=described(explained(exception, job)),
                        delay_ms=message.options.get(BACKOFF_OPTION))
            return
        # Counted before DeadLetters (whose after-hook runs next) writes the dead letter.
        self._runs(actor_name, "dead").inc()
