"""``RunEnded`` sends ``job_run_ended`` once a run's outcome is decided: ``success``, ``retry`` or
``dead``, for code above the jobs layer that follows runs (the schedules' overlap rule)."""

from __future__ import annotations

from typing import Any

from django.dispatch import Signal
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Middleware, Shutdown

__all__ = ["RunEnded", "job_run_ended"]

# Sent with ``message`` (the MessageProxy) and ``outcome``; a receiver's exception is logged by
# Dramatiq and does not change the run's outcome.
job_run_ended = Signal()


class RunEnded(Middleware):
    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        if not job_run_ended.has_listeners():
            return
        if exception is None:
            outcome = "dead" if message.failed else "success"
        else:
            outcome = "dead" if message.failed and not isinstance(exception, Shutdown) else "retry"
        job_run_ended.send(sender=RunEnded, message=message, outcome=outcome)
