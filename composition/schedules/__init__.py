"""Schedules: jobs fired at cron or fixed-interval ticks, once per tick across every host.

Declare them with ``schedule()`` in an app's ``schedules.py``; every ``runworkers`` runs a
``SchedulerComponent`` and the database makes each tick fire once (no leader). Invariant: a
tick's row, its job's outbox row and the schedule's watermark commit in one transaction.
Modules: ``declaration``, ``ticks`` (cron and zones), ``problems`` (the check), ``models``,
``firing`` (one round of one schedule), ``component``, ``context`` (inside a run), ``runs``
(the ledger of runs for ``overlap="skip"``), ``pausing``, ``status`` (what ``schedules list`` shows).
"""

from composition.schedules.context import current_fire_at, current_tick_is_catch_up
from composition.schedules.declaration import Schedule, declared, schedule
from composition.schedules.pausing import pause_schedule, resume_schedule
from composition.schedules.ticks import TZDATA_VERSION, next_tick, schedule_zone

__all__ = [
    "TZDATA_VERSION",
    "Schedule",
    "current_fire_at",
    "current_tick_is_catch_up",
    "declared",
    "next_tick",
    "pause_schedule",
    "resume_schedule",
    "schedule",
    "schedule_zone",
]
