"""``RunSignals`` sends ``job_run_started`` before a run's body and ``job_run_ended`` once its
outcome is decided (``success``, ``retry``, ``dead``, ``expired``: dropped unrun past its expiry,
or ``skipped``: Dramatiq's ``SkipMessage`` ended it, acknowledged and never retried), for the
messages published with the ``FOLLOW_RUNS_HEADER`` header, for code above the jobs layer that
follows their runs (the schedules' overlap rule), and for every message while
``every_run_followed()`` is in force (a test's ``run_queued_jobs()``). Any other message costs one
dictionary lookup per hook."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.dispatch import Signal
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Middleware, Shutdown

from composition.broker.pausing import handed_back
from composition.jobs.middleware.expiry import expired
from composition.jobs.middleware.put_backs import put_back

__all__ = ["FOLLOW_RUNS_HEADER", "RunSignals", "every_run_followed", "job_run_ended", "job_run_started"]

# A header (in options["composition"]) a publisher sets to true to have the message's runs signalled.
FOLLOW_RUNS_HEADER = "follow_runs"

# Both are sent with ``broker`` and ``message`` (the MessageProxy); ``job_run_ended`` with
# ``outcome`` and ``exception`` (the run's, or None) too. A receiver's exception is logged by
# Dramatiq and changes nothing of the run.
# The receivers are looked up once (one sender, use_caching).
job_run_started = Signal(use_caching=True)
job_run_ended = Signal(use_caching=True)


_every_lock = threading.Lock()
_every_depth = 0


@contextmanager
def every_run_followed() -> Iterator[None]:
    """Inside the block every message's runs in this process are signalled, header or not."""
    global _every_depth
    with _every_lock:
        _every_depth += 1
    try:
        yield
    finally:
        with _every_lock:
            _every_depth -= 1


def _followed(message: MessageProxy) -> bool:
    if _every_depth:
        return True
    headers = message.options.get("composition")
    return isinstance(headers, dict) and headers.get(FOLLOW_RUNS_HEADER) is True


class RunSignals(Middleware):
    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        if _followed(message):
            job_run_started.send(sender=RunSignals, broker=broker, message=message)

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        if not _followed(message):
            return
        if exception is None:
            outcome = "dead" if message.failed else "success"
        else:
            outcome = "dead" if message.failed and not isinstance(exception, Shutdown) else "retry"
        job_run_ended.send(sender=RunSignals, broker=broker, message=message, outcome=outcome, exception=exception)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        # A message put back to wait (a limit, a deploy) or handed back (a paused queue) has not
        # run: its own run, later, ends it. Any other skip (the body's SkipMessage, an expired
        # message) is the end of the message, dead-lettered when it failed.
        if not _followed(message) or put_back(message) or handed_back(message):
            return
        outcome = "dead" if message.failed else "expired" if expired(message) else "skipped"
        job_run_ended.send(sender=RunSignals, broker=broker, message=message, outcome=outcome, exception=None)
