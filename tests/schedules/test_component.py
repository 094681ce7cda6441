"""The scheduler's loop: after a failed round it waits longer each time, and a round that
succeeds brings back its usual cadence."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from django.db import ProgrammingError

from composition.schedules import Schedule
from composition.schedules.component import MAX_WAIT_S, SchedulerComponent
from composition.testing import wait_until
from tests.helpers import unique
from tests.jobsapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)


class FailingClock:
    """The database's clock, failing as a database without composition's migrations failed every
    round (the first query of one), until ``recover()``."""

    def __init__(self) -> None:
        self.calls = 0
        self.failing = True

    def recover(self) -> None:
        self.failing = False

    def __call__(self) -> datetime:
        self.calls += 1
        if self.failing:
            raise ProgrammingError("column composition_schedulestate.timing does not exist")
        return datetime.now(UTC)


def test_the_scheduler_backs_off_after_failed_rounds_and_resumes_its_cadence_after_one_succeeds() -> None:
    # It went again every 20 ms: about 40 failed rounds a second, each a warning.
    yearly = Schedule(name=unique("sched"), actor_name=jobs.scheduled_effect.actor_name, cron="0 0 1 1 *")
    clock = FailingClock()
    scheduler = SchedulerComponent([yearly], clock=clock)
    scheduler.start()
    try:
        time.sleep(1.5)
        # Waits of 0.1, 0.2, 0.4 and 0.8 s (jittered up to half as much again) fit in 1.5 s.
        assert 2 <= clock.calls <= 5, clock.calls
        clock.recover()
        wait_until(lambda: scheduler.failed_rounds == 0, 5, message="no round succeeded after the recovery")
        assert scheduler.interval_s <= MAX_WAIT_S
    finally:
        scheduler.stop(5)
