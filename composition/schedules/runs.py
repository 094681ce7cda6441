"""When a scheduled run is over, for ``overlap="skip"`` and ``max_pending``: its tick row's
``finished_at``, set when the jobs layer's ``job_run_ended`` says the run succeeded or died (a
retry is still the same run). A run that never reports back frees its schedule when its tick's
lease ends (``firing.PENDING_LEASE``)."""

from __future__ import annotations

from typing import Any

from django.db.models.functions import Now

from composition.jobs.middleware.run_ended import job_run_ended
from composition.schedules.context import schedule_header
from composition.schedules.models import ScheduleTick

__all__ = ["connect", "mark_run_ended"]


def mark_run_ended(sender: Any, *, message: Any, outcome: str, **_: Any) -> None:
    if outcome == "retry":
        return
    header = schedule_header(message.options)
    if header is None or not isinstance(header.get("tick"), int):
        return
    ScheduleTick.objects.filter(pk=header["tick"], finished_at__isnull=True).update(finished_at=Now())


def connect() -> None:
    job_run_ended.connect(mark_run_ended, dispatch_uid="composition-schedule-runs")
