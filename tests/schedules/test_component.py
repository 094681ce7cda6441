"""The scheduler's loop: after a failed round it waits longer each time, and a round that
succeeds brings back its usual cadence."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import ProgrammingError, connection
from structlog.testing import capture_logs

from composition.schedules import Schedule
from composition.schedules.component import MAX_WAIT_S, SchedulerComponent
from composition.schedules.models import ScheduleTick
from composition.testing import wait_until
from tests.helpers import unique
from tests.jobsapp import jobs
from tests.schedules.test_firing import DbClock

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


def test_one_schedule_that_fails_every_round_says_so_once_and_the_others_fire() -> None:
    # Its warning came every round, a second apart at most, for as long as it failed.
    good, bad = unique("sched-good"), unique("sched-bad")
    table = ScheduleTick._meta.db_table
    with connection.cursor() as cursor:  # a user's audit trigger refusing one schedule's ticks
        cursor.execute(f"""
            CREATE FUNCTION refuse_one_schedule() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.schedule = '{bad}' THEN RAISE EXCEPTION 'refused by an audit trigger'; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_one_schedule BEFORE INSERT ON {table}
                FOR EACH ROW EXECUTE FUNCTION refuse_one_schedule();""")
    clock = DbClock(datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC))
    every = timedelta(seconds=1)
    scheduler = SchedulerComponent([Schedule(name=name, actor_name=jobs.scheduled_effect.actor_name, every=every,
                                             payload={"label": name})
                                    for name in (good, bad)], clock=clock, host_clock=clock)
    try:
        with capture_logs() as logs:
            for _ in range(12):
                clock.now += every
                scheduler.tick()
            with connection.cursor() as cursor:
                cursor.execute(f"DROP TRIGGER refuse_one_schedule ON {table}; DROP FUNCTION refuse_one_schedule();")
            clock.now += every
            scheduler.tick()
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS refuse_one_schedule ON {table};"
                           "DROP FUNCTION IF EXISTS refuse_one_schedule();")

    failed = [entry for entry in logs if entry["event"] == "schedule round failed" and entry["schedule"] == bad]
    warned = [entry for entry in failed if entry["log_level"] == "warning"]
    assert len(warned) == 1, warned
    assert len(failed) == 11  # tried every round all the same (the first makes its state row)
    assert "refused by an audit trigger" in failed[0]["error"]
    assert ScheduleTick.objects.filter(schedule=good).count() >= 10
    back = [entry for entry in logs if entry["event"] == "rounds succeed again" and "schedule" in entry]
    assert [(entry["schedule"], entry["failed_rounds"]) for entry in back] == [(bad, len(failed))]
    assert ScheduleTick.objects.filter(schedule=bad).exists()  # its due ticks fire once it can
