"""Pausing and resuming a schedule for every host, durably: ``pause_schedule``, ``resume_schedule``.

A schedule's pause is a ``composition.pauses.Pause`` row of kind ``schedule``, as a queue's is.
The row holds one span (when the last pause began, when it last changed), and the scheduler
counts the ticks in it as paused even when none ran until after the resume; so a pause again
before any scheduler fired past the resume keeps the earlier start (``keep_start``).
"""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import Any

from composition.pauses import Pause, pause, resume
from composition.schedules.models import ScheduleState

__all__ = ["pause_schedule", "resume_schedule"]


def _unsettled(name: str, resumed_at: datetime) -> bool:
    """Whether no scheduler has fired ``name`` past its last resume: that pause's ticks are not
    counted yet (with any tick between, which no scheduler saw either)."""
    return ScheduleState.objects.filter(name=name, watermark__lt=resumed_at).exists()


def pause_schedule(name: str, *, by: str, reason: str = "", user: Any = None) -> tuple[Pause, bool]:
    """Pause schedule ``name`` for every host: its ticks from now until the resume are counted
    ``paused`` and never fire. Returns the row and whether this call changed it."""
    return pause(Pause.SCHEDULE, name, by=by, reason=reason, user=user, keep_start=partial(_unsettled, name))


def resume_schedule(name: str, *, by: str, reason: str = "", user: Any = None) -> tuple[Pause | None, bool]:
    """Undo ``pause_schedule``: the next tick fires. The row (None when it was never paused) and
    whether this call changed it."""
    return resume(Pause.SCHEDULE, name, by=by, reason=reason, user=user)
