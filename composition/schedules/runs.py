"""Whether a scheduled run is still going, for ``overlap="skip"`` and ``max_pending``: its tick
row's ``finished_at`` and ``lease_until``, kept from the jobs layer's run signals.

A fired tick is pending until ``firing.PENDING_LEASE`` after it fired; when its run starts, the
lease becomes the job's time limit plus ``RUN_LEASE_MARGIN``; a retry extends it by the backoff;
success, a dead letter or a skip (``SkipMessage``) ends it. A run killed without a word (SIGKILL, a lost message) stops
holding its schedule when its lease ends.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models.functions import Now

from composition.jobs.middleware.retries import BACKOFF_OPTION
from composition.jobs.middleware.run_signals import job_run_ended, job_run_started
from composition.schedules.context import schedule_header
from composition.schedules.models import ScheduleTick

__all__ = ["RUN_LEASE_MARGIN", "connect", "mark_run_ended", "mark_run_started"]

RUN_LEASE_MARGIN = timedelta(seconds=30)
# Dramatiq's own default time limit, for an actor declared without one.
DEFAULT_TIME_LIMIT = timedelta(minutes=10)


def _tick_id(message: Any) -> int | None:
    header = schedule_header(message.options)
    tick = header.get("tick") if header else None
    return tick if isinstance(tick, int) else None


def _time_limit(broker: Any, actor_name: str) -> timedelta:
    actor = broker.actors.get(actor_name)
    limit_ms = actor.options.get("time_limit") if actor is not None else None
    return timedelta(milliseconds=limit_ms) if limit_ms else DEFAULT_TIME_LIMIT


def mark_run_started(sender: Any, *, broker: Any, message: Any, **_: Any) -> None:
    tick = _tick_id(message)
    if tick is not None:
        lease = _time_limit(broker, message.actor_name) + RUN_LEASE_MARGIN
        ScheduleTick.objects.filter(pk=tick, finished_at__isnull=True).update(lease_until=Now() + lease)


def mark_run_ended(sender: Any, *, broker: Any, message: Any, outcome: str, **_: Any) -> None:
    tick = _tick_id(message)
    if tick is None:
        return
    if outcome == "retry":
        # Still the same run: held through the backoff and the next attempt.
        backoff = timedelta(milliseconds=int(message.options.get(BACKOFF_OPTION) or 0))
        lease = backoff + _time_limit(broker, message.actor_name) + RUN_LEASE_MARGIN
        ScheduleTick.objects.filter(pk=tick, finished_at__isnull=True).update(lease_until=Now() + lease)
        return
    ScheduleTick.objects.filter(pk=tick, finished_at__isnull=True).update(finished_at=Now())


def connect() -> None:
    job_run_started.connect(mark_run_started, dispatch_uid="composition-schedule-runs-started")
    job_run_ended.connect(mark_run_ended, dispatch_uid="composition-schedule-runs-ended")
