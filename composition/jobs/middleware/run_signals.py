"""``RunSignals`` sends ``job_run_started`` before a run's body and ``job_run_ended`` once its
outcome is decided (``success``, ``retry`` or ``dead``), for code above the jobs layer that follows
runs (the schedules' overlap rule). With no receiver connected it costs one check per hook."""

from __future__ import annotations

from typing import Any

from django.dispatch import Signal
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Middleware, Shutdown

__all__ = ["RunSignals", "job_run_ended", "job_run_started"]

# Both are sent with ``broker`` and ``message`` (the MessageProxy); ``job_run_ended`` with
# ``outcome`` too. A receiver's exception is logged by Dramatiq and changes nothing of the run.
# Sent twice per job: the receivers are looked up once (one sender, use_caching).
job_run_started = Signal(use_caching=True)
job_run_ended = Signal(use_caching=True)


class RunSignals(Middleware):
    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        if job_run_started.has_listeners(RunSignals):
            job_run_started.send(sender=RunSignals, broker=broker, message=message)

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        if not job_run_ended.has_listeners(RunSignals):
            return
        if exception is None:
            outcome = "dead" if message.failed else "success"
        else:
            outcome = "dead" if message.failed and not isinstance(exception, Shutdown) else "retry"
        job_run_ended.send(sender=RunSignals, broker=broker, message=message, outcome=outcome)
