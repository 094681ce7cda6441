"""What ``schedules list`` (and the operations page) shows of each schedule: ``schedule_rows()``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from composition.conf import conf
from composition.pauses import Pause
from composition.schedules.declaration import declared, duplicate_names
from composition.schedules.firing import database_now, superseded
from composition.schedules.models import ScheduleState
from composition.schedules.problems import problems
from composition.schedules.ticks import next_tick

__all__ = ["NOT_DECLARED", "ScheduleRow", "schedule_rows"]

# The problem of a paused schedule no code declares (removed, or renamed): listed, so that its
# pause is seen and can be lifted before it is declared again (it would come back paused).
NOT_DECLARED = "not declared: removed from the code or renamed, and still paused"


@dataclass(frozen=True)
class ScheduleRow:
    name: str
    job: str
    expression: str  # "cron 30 2 * * *" or "every 30s"
    tz: str
    last_fired_at: datetime | None
    next_fire_at: datetime | None
    # How far the schedule is behind: now minus the oldest tick not yet evaluated (0 when none is due).
    lag_s: float
    fired: int
    caught_up: int
    missed: int
    skipped: int
    paused_ticks: int
    paused: Pause | None
    problems: tuple[str, ...]
    # A deploy changed the timing and the hosts of the new one fire it: this code's timing (the
    # one before) leaves it to them until then, and its lag and next fire are not this code's.
    left_to_timing: str = ""
    left_until: datetime | None = None


def _history(state: ScheduleState | None) -> dict[str, Any]:
    """What a row shows of the schedule's state row: its last fire and its counts."""
    return {"last_fired_at": state.last_fired_at if state else None, "fired": state.fired if state else 0,
            "caught_up": state.caught_up if state else 0, "missed": state.missed if state else 0,
            "skipped": state.skipped if state else 0, "paused_ticks": state.paused if state else 0}


def schedule_rows() -> list[ScheduleRow]:
    now = database_now()
    states = {state.name: state for state in ScheduleState.objects.all()}
    pauses = {pause.name: pause for pause in Pause.objects.filter(kind=Pause.SCHEDULE, paused=True)}
    rows = []
    twice = set(duplicate_names())
    for name, entry in declared().items():
        found = tuple(problems(entry))
        if name in twice:  # composition.E120; the last declaration is the one shown
            found += ("declared twice with different arguments",)
        state = states.get(name)
        upcoming = lag_s = left_until = None
        if not found and state is not None and state.timing_changed_at and superseded(state, entry, now):
            left_until = state.timing_changed_at + timedelta(seconds=float(conf.DEPLOY_WINDOW_S))
        elif not found:
            upcoming = next_tick(entry, state.watermark if state else now)
            lag_s = max((now - upcoming).total_seconds(), 0.0)
        rows.append(ScheduleRow(
            name=str(name), job=entry.actor_name, expression=entry.when, tz=str(entry.tz), next_fire_at=upcoming,
            lag_s=lag_s or 0.0, paused=pauses.get(name), problems=found,
            left_to_timing=state.timing if state and left_until else "", left_until=left_until, **_history(state)))
    for name in sorted(set(pauses) - set(declared())):
        rows.append(ScheduleRow(name=name, job="-", expression="-", tz="-", next_fire_at=None, lag_s=0.0,
                                paused=pauses[name], problems=(NOT_DECLARED,), **_history(states.get(name))))
    return rows
