"""Firing with the database's clock driven by the test: no backfill, catch-up policies after an
outage, pauses, manual runs, the tick's unique row, and schedulers whose host clocks disagree."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.test import override_settings
from structlog.testing import capture_logs

from composition.outbox import OutboxMessage
from composition.pauses import Pause, pause, resume
from composition.schedules import Schedule, pause_schedule, resume_schedule
from composition.schedules.component import SchedulerComponent
from composition.schedules.firing import fire_due, run_now
from composition.schedules.models import ScheduleState, ScheduleTick
from composition.testing import metric_value
from tests.helpers import unique
from tests.jobsapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
PERIOD = timedelta(seconds=10)


class DbClock:
    """The database's clock as the test sets it."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def name() -> Iterator[str]:
    yield unique("sched")


def _every(name: str, **options: Any) -> Schedule:
    options.setdefault("grace", timedelta(seconds=2))
    return Schedule(name=name, actor_name=jobs.scheduled_effect.actor_name, every=PERIOD,
                    payload={"label": name}, **options)


def _ticks(name: str) -> list[tuple[datetime, bool]]:
    return [(tick.fire_at, tick.catch_up)
            for tick in ScheduleTick.objects.filter(schedule=name, manual=False).order_by("fire_at")]


def _published(name: str) -> list[dict[str, Any]]:
    rows = OutboxMessage.objects.filter(actor_name=jobs.scheduled_effect.actor_name).order_by("id")
    return [row.headers["schedule"] for row in rows if row.headers.get("schedule", {}).get("name") == name]


def _run_through(declared: Schedule, clock: DbClock, until: datetime, step: timedelta = PERIOD) -> None:
    while clock.now < until:
        clock.now = min(clock.now + step, until)
        fire_due(declared, clock)


def test_a_new_schedule_starts_from_now_and_then_fires_each_tick_once(name: str) -> None:
    declared, clock = _every(name), DbClock(T0 + timedelta(seconds=3))
    assert fire_due(declared, clock) is None  # creates the state: nothing before now fires
    assert ScheduleState.objects.get(name=name).watermark == clock.now
    _run_through(declared, clock, T0 + timedelta(seconds=33), step=timedelta(seconds=1))
    assert _ticks(name) == [(T0 + PERIOD * k, False) for k in (1, 2, 3)]
    headers = _published(name)
    assert [header["fire_at"] for header in headers] == [(T0 + PERIOD * k).isoformat() for k in (1, 2, 3)]
    assert all(header["catch_up"] is False and header["manual"] is False for header in headers)
    assert metric_value("composition_schedule_ticks_total", schedule=name, outcome="fired") == 3


@pytest.mark.parametrize(("catch_up", "fired"), [
    ("skip", []),
    ("latest", [10]),
    ("all", list(range(1, 11))),
])
def test_after_an_outage_of_10_5_periods_the_catch_up_policy_decides(name: str, catch_up: str,
                                                                    fired: list[int]) -> None:
    extra = {"catch_up_window": PERIOD * 15} if catch_up == "all" else {}
    declared, clock = _every(name, catch_up=catch_up, **extra), DbClock(T0)
    fire_due(declared, clock)
    clock.now = T0 + PERIOD * 10.5  # every scheduler was down from T0 until now
    fire_due(declared, clock)
    assert _ticks(name) == [(T0 + PERIOD * k, True) for k in fired]  # oldest first, each a catch-up
    state = ScheduleState.objects.get(name=name)
    assert (state.caught_up, state.missed, state.watermark) == (len(fired), 10 - len(fired), T0 + PERIOD * 10)
    assert metric_value("composition_schedule_ticks_total", schedule=name, outcome="missed") == 10 - len(fired)
    # The tick due after the restart fires normally.
    clock.now = T0 + PERIOD * 11 + timedelta(seconds=1)
    fire_due(declared, clock)
    assert _ticks(name)[-1] == (T0 + PERIOD * 11, False)


def test_catch_up_all_fires_only_inside_its_window_and_at_most_its_cap(name: str) -> None:
    declared = _every(name, catch_up="all", catch_up_window=PERIOD * 6, catch_up_max=4)
    clock = DbClock(T0)
    fire_due(declared, clock)
    clock.now = T0 + PERIOD * 10.5
    fire_due(declared, clock)
    # Inside the window: ticks 5..10 (6 of them); the cap keeps the 4 most recent, oldest first.
    assert _ticks(name) == [(T0 + PERIOD * k, True) for k in (7, 8, 9, 10)]
    assert ScheduleState.objects.get(name=name).missed == 6


def test_a_tick_late_by_less_than_the_grace_fires_on_time(name: str) -> None:
    declared, clock = _every(name, catch_up="skip", grace=timedelta(seconds=25)), DbClock(T0)
    fire_due(declared, clock)
    clock.now = T0 + PERIOD * 3 + timedelta(seconds=1)  # ticks 1 (21 s late), 2 (11 s) and 3 (1 s)
    fire_due(declared, clock)
    assert _ticks(name) == [(T0 + PERIOD * k, False) for k in (1, 2, 3)]


def test_ticks_due_while_paused_are_counted_and_never_caught_up_and_resume_fires_the_next(name: str) -> None:
    declared, clock = _every(name, catch_up="all", catch_up_window=PERIOD * 100), DbClock(T0)
    fire_due(declared, clock)
    pause(Pause.SCHEDULE, name, by="test", reason="maintenance")
    Pause.objects.filter(name=name).update(paused_at=T0)  # on the test's clock, as the ticks are
    _run_through(declared, clock, T0 + PERIOD * 5 + timedelta(seconds=1))
    assert _ticks(name) == []
    assert ScheduleState.objects.get(name=name).paused == 5
    assert metric_value("composition_schedule_ticks_total", schedule=name, outcome="paused") == 5
    resume(Pause.SCHEDULE, name, by="test")
    Pause.objects.filter(name=name).update(changed_at=clock.now)
    _run_through(declared, clock, T0 + PERIOD * 6 + timedelta(seconds=1))
    assert _ticks(name) == [(T0 + PERIOD * 6, False)]


def test_a_manual_run_has_its_own_row_and_does_not_suppress_the_regular_tick(name: str) -> None:
    declared, clock = _every(name), DbClock(T0)
    fire_due(declared, clock)
    clock.now = T0 + PERIOD
    run_now(declared, clock=clock)
    fire_due(declared, clock)
    rows = list(ScheduleTick.objects.filter(schedule=name).order_by("id").values_list("fire_at", "manual"))
    assert rows == [(T0 + PERIOD, True), (T0 + PERIOD, False)]
    assert [header["manual"] for header in _published(name)] == [True, False]

    # A run at 12:00:10.7 is not the 12:00:10 tick to a job that keys its effects on the tick.
    clock.now = T0 + PERIOD * 2 + timedelta(milliseconds=700)
    fire_due(declared, clock)
    run_now(declared, clock=clock)
    assert [header["fire_at"] for header in _published(name)][-2:] \
        == [(T0 + PERIOD * 2).isoformat(), (T0 + PERIOD * 2 + timedelta(milliseconds=700)).isoformat()]


def test_the_database_refuses_a_second_row_for_one_tick(name: str) -> None:
    ScheduleTick.objects.create(schedule=name, fire_at=T0, created_at=T0)
    with pytest.raises(IntegrityError), transaction.atomic():
        ScheduleTick.objects.create(schedule=name, fire_at=T0, created_at=T0)
    ScheduleTick.objects.create(schedule=name, fire_at=T0, created_at=T0, manual=True)  # a run by hand may


def test_overlap_skip_fires_nothing_while_a_run_is_pending_and_max_pending_bounds_the_queue(name: str) -> None:
    declared, clock = _every(name, overlap="skip"), DbClock(T0)
    fire_due(declared, clock)
    _run_through(declared, clock, T0 + PERIOD * 3 + timedelta(seconds=1))
    assert _ticks(name) == [(T0 + PERIOD, False)]  # ticks 2 and 3: the first run is still pending
    assert ScheduleState.objects.get(name=name).skipped == 2
    ScheduleTick.objects.filter(schedule=name).update(finished_at=clock.now)
    _run_through(declared, clock, T0 + PERIOD * 4 + timedelta(seconds=1))
    assert _ticks(name)[-1] == (T0 + PERIOD * 4, False)

    bounded, clock = _every(name + "-b", max_pending=2), DbClock(T0)
    fire_due(bounded, clock)
    _run_through(bounded, clock, T0 + PERIOD * 4 + timedelta(seconds=1))
    assert [tick for tick, _ in _ticks(name + "-b")] == [T0 + PERIOD, T0 + PERIOD * 2]


def test_schedulers_whose_host_clocks_differ_by_30_s_fire_each_tick_once(name: str) -> None:
    """Two schedulers race on real threads and connections; their host clocks are 30 s apart,
    and ticks follow the database's clock (driven here), so each tick fires once."""
    declared, clock = _every(name), DbClock(T0)
    fire_due(declared, clock)
    schedulers = [SchedulerComponent([declared], clock=clock, host_clock=lambda skew=skew: clock.now + skew)
                  for skew in (timedelta(0), timedelta(seconds=30))]
    errors: list[BaseException] = []

    def race(scheduler: SchedulerComponent, rounds: int) -> None:
        try:
            for _ in range(rounds):
                scheduler.tick()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    for _ in range(20):
        clock.now += timedelta(seconds=5)
        threads = [threading.Thread(target=race, args=(scheduler, 3)) for scheduler in schedulers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors
    fired = [tick for tick, _ in _ticks(name)]
    assert fired == [T0 + PERIOD * k for k in range(1, 11)]
    assert len(_published(name)) == 10


def test_retention_prunes_old_ticks_whose_run_ended_and_keeps_a_pending_one(name: str) -> None:
    from django.utils import timezone

    from composition.retention import schedule_ticks_older_than

    old = timezone.now() - timedelta(days=8)
    ended = ScheduleTick.objects.create(schedule=name, fire_at=old, created_at=old, finished_at=old)
    pending = ScheduleTick.objects.create(schedule=name, fire_at=old + PERIOD, created_at=old,
                                          lease_until=timezone.now() + timedelta(hours=1))
    recent = ScheduleTick.objects.create(schedule=name, fire_at=timezone.now(), created_at=timezone.now(),
                                         finished_at=timezone.now())
    doomed = set(schedule_ticks_older_than(7 * 86_400).filter(schedule=name).values_list("pk", flat=True))
    assert doomed == {ended.pk}
    assert {pending.pk, recent.pk}.isdisjoint(doomed)


@pytest.mark.parametrize(("cron", "day", "expected"), [
    # Hand-written from the transitions (docs/schedules.md has the same table).
    ("30 2 * * *", "2026-03-28 23:00", ["2026-03-29 01:00"]),
    ("30 2 * * *", "2026-10-24 22:00", ["2026-10-25 00:30"]),
    ("*/15 2 * * *", "2026-03-28 23:00", []),
    ("*/15 2 * * *", "2026-10-24 22:00", ["2026-10-25 00:00", "2026-10-25 00:15", "2026-10-25 00:30",
                                          "2026-10-25 00:45", "2026-10-25 01:00", "2026-10-25 01:15",
                                          "2026-10-25 01:30", "2026-10-25 01:45"]),
    ("0 */2 * * *", "2026-10-24 22:00", ["2026-10-24 22:00", "2026-10-25 00:00", "2026-10-25 01:00",
                                         "2026-10-25 03:00", "2026-10-25 05:00", "2026-10-25 07:00",
                                         "2026-10-25 09:00", "2026-10-25 11:00", "2026-10-25 13:00",
                                         "2026-10-25 15:00", "2026-10-25 17:00", "2026-10-25 19:00",
                                         "2026-10-25 21:00"]),
])
def test_a_scheduler_driven_through_a_berlin_dst_day_fires_at_the_hand_written_instants(
        name: str, cron: str, day: str, expected: list[str]) -> None:
    declared = Schedule(name=name, actor_name=jobs.scheduled_effect.actor_name, cron=cron, tz="Europe/Berlin",
                        payload={"label": name}, grace=timedelta(minutes=20))
    start = datetime.fromisoformat(day).replace(tzinfo=UTC)
    clock = DbClock(start - timedelta(seconds=1))
    fire_due(declared, clock)
    # Every 10 minutes, within the grace: each tick fires on time, none is caught up.
    _run_through(declared, clock, start + timedelta(hours=24, seconds=-1), step=timedelta(minutes=10))
    assert [tick.strftime("%Y-%m-%d %H:%M") for tick, _ in _ticks(name)] == expected


def test_after_an_outage_longer_than_a_round_keeps_latest_still_fires_one_catch_up(name: str) -> None:
    """12,000 missed ticks of an every-second schedule, more than one round keeps (10,000): one
    catch-up, the newest, and the rest counted as missed, in one round."""
    declared = Schedule(name=name, actor_name=jobs.scheduled_effect.actor_name, every=timedelta(seconds=1),
                        payload={"label": name}, grace=timedelta(0))
    clock = DbClock(T0)
    fire_due(declared, clock)
    clock.now = T0 + timedelta(seconds=12_000, milliseconds=500)
    fire_due(declared, clock)
    assert _ticks(name) == [(T0 + timedelta(seconds=12_000), True)]
    state = ScheduleState.objects.get(name=name)
    assert (state.fired, state.caught_up, state.missed) == (0, 1, 11_999)
    assert state.watermark == T0 + timedelta(seconds=12_000)


def test_a_run_that_started_and_never_reported_back_frees_its_schedule_when_its_lease_ends(name: str) -> None:
    """The run signals keep a tick's lease: started (the job's time limit plus a margin), retried
    (plus the backoff), ended (finished). A run killed without a word holds until its lease ends."""
    from django.utils import timezone
    from dramatiq import Message
    from dramatiq.broker import MessageProxy

    from composition.broker.configured import configured_broker
    from composition.schedules.runs import RUN_LEASE_MARGIN, mark_run_ended, mark_run_started

    declared, clock = _every(name, overlap="skip"), DbClock(timezone.now().replace(microsecond=0))
    fire_due(declared, clock)
    clock.now += PERIOD
    fire_due(declared, clock)
    (tick,) = ScheduleTick.objects.filter(schedule=name)
    row = OutboxMessage.objects.get(headers__schedule__tick=tick.pk)
    message = MessageProxy(Message(queue_name=jobs.SCHEDULE_QUEUE, actor_name=row.actor_name, args=(),
                                   kwargs=row.payload, options={"composition": row.headers}))
    broker = configured_broker()
    limit = timedelta(milliseconds=broker.get_actor(row.actor_name).options["time_limit"])
    mark_run_started(None, broker=broker, message=message)  # then the worker is SIGKILLed
    tick.refresh_from_db()
    lease_end = tick.lease_until
    assert abs(lease_end - (timezone.now() + limit + RUN_LEASE_MARGIN)) < timedelta(seconds=5)
    clock.now = lease_end - timedelta(seconds=1)
    fire_due(declared, clock)
    assert len(_ticks(name)) == 1  # still held
    clock.now = lease_end + PERIOD  # a tick is due after the lease's end, whatever its phase
    fire_due(declared, clock)
    assert len(_ticks(name)) == 2  # the lease ended: the schedule is free
    mark_run_ended(None, broker=broker, message=message, outcome="dead")
    tick.refresh_from_db()
    assert tick.finished_at is not None


def test_a_schedule_switched_from_overlap_allow_to_skip_is_not_held_by_its_unfollowed_runs(name: str) -> None:
    # Runs fired under overlap="allow" are not followed (nothing marks them ended): they held a
    # pending lease of an hour all the same, and the redeployed overlap="skip" skipped every tick.
    allow, clock = _every(name), DbClock(T0)
    fire_due(allow, clock)
    _run_through(allow, clock, T0 + PERIOD * 3 + timedelta(seconds=1))
    assert len(_ticks(name)) == 3
    skip = _every(name, overlap="skip")
    _run_through(skip, clock, T0 + PERIOD * 4 + timedelta(seconds=1))
    assert _ticks(name)[-1] == (T0 + PERIOD * 4, False)


def test_a_run_by_hand_does_not_hold_back_the_regular_ticks_of_an_overlap_skip_schedule(name: str) -> None:
    declared, clock = _every(name, overlap="skip"), DbClock(T0)
    fire_due(declared, clock)
    clock.now = T0 + timedelta(seconds=5)
    run_now(declared, clock=clock)
    _run_through(declared, clock, T0 + PERIOD + timedelta(seconds=1))
    assert _ticks(name) == [(T0 + PERIOD, False)]


def test_ticks_due_while_paused_stay_paused_when_no_scheduler_ran_until_after_the_resume(name: str) -> None:
    # pause, stop the workers, resume, start them: nobody saw the ticks while paused, and the
    # catch-up policy replayed them.
    declared, clock = _every(name, catch_up="all", catch_up_window=PERIOD * 100), DbClock(T0)
    fire_due(declared, clock)
    pause(Pause.SCHEDULE, name, by="test", reason="maintenance")
    Pause.objects.filter(name=name).update(paused_at=T0)  # on the test's clock, as the ticks are
    clock.now = T0 + PERIOD * 5 + timedelta(seconds=5)
    resume(Pause.SCHEDULE, name, by="test")
    assert Pause.objects.get(name=name).paused_at == T0, "a resume keeps when the pause began"
    Pause.objects.filter(name=name).update(changed_at=clock.now)
    fire_due(declared, clock)
    assert _ticks(name) == []
    assert ScheduleState.objects.get(name=name).paused == 5
    _run_through(declared, clock, T0 + PERIOD * 6 + timedelta(seconds=1))
    assert _ticks(name) == [(T0 + PERIOD * 6, False)]


def test_ticks_of_two_pauses_that_no_scheduler_saw_stay_paused(name: str) -> None:
    # pause, resume, pause, resume, all with the workers stopped: the row kept only the second
    # pause's span, and the catch-up policy replayed the first pause's ticks.
    declared, clock = _every(name, catch_up="all", catch_up_window=PERIOD * 100), DbClock(T0)
    fire_due(declared, clock)

    first = T0 + timedelta(seconds=1)

    def change(at: datetime, paused: bool) -> None:
        (pause_schedule if paused else resume_schedule)(name, by="test")
        rows = Pause.objects.filter(name=name)
        rows.update(changed_at=at)  # on the test's clock, as the ticks are
        if paused:  # a pause that began a span of its own (paused_at the database's now)
            rows.exclude(paused_at=first).update(paused_at=at)

    change(first, paused=True)
    change(T0 + PERIOD * 2 + timedelta(seconds=5), paused=False)
    change(T0 + PERIOD * 3 + timedelta(seconds=5), paused=True)
    assert Pause.objects.get(name=name).paused_at == first, "no scheduler counted the first pause's ticks yet"
    clock.now = T0 + PERIOD * 5 + timedelta(seconds=5)
    change(clock.now, paused=False)
    fire_due(declared, clock)
    assert _ticks(name) == []
    assert ScheduleState.objects.get(name=name).paused == 5


@pytest.mark.parametrize("round_while_paused", [False, True], ids=["no-round-while-paused", "a-round-while-paused"])
def test_ticks_an_outage_missed_before_a_pause_are_missed_however_the_rounds_fell(
        name: str, round_while_paused: bool) -> None:
    # Every scheduler down from T0; paused after tick 5, resumed after tick 8. Whether one came
    # back while paused must not decide whether the ticks from before the pause are caught up.
    declared, clock = _every(name, catch_up="latest"), DbClock(T0)
    fire_due(declared, clock)
    pause(Pause.SCHEDULE, name, by="test", reason="maintenance")
    Pause.objects.filter(name=name).update(paused_at=T0 + PERIOD * 5 + timedelta(seconds=5))
    if round_while_paused:
        clock.now = T0 + PERIOD * 7 + timedelta(seconds=5)
        fire_due(declared, clock)
    resume(Pause.SCHEDULE, name, by="test")
    Pause.objects.filter(name=name).update(changed_at=T0 + PERIOD * 8 + timedelta(seconds=5))
    clock.now = T0 + PERIOD * 8 + timedelta(seconds=7)
    fire_due(declared, clock)
    assert _ticks(name) == []
    state = ScheduleState.objects.get(name=name)
    assert (state.missed, state.paused, state.caught_up) == (5, 3, 0)
    _run_through(declared, clock, T0 + PERIOD * 9 + timedelta(seconds=1))
    assert _ticks(name) == [(T0 + PERIOD * 9, False)]


def test_a_new_period_starts_from_its_deploy_instead_of_catching_up_the_new_timing_s_ticks(name: str) -> None:
    hourly = Schedule(name=name, actor_name=jobs.scheduled_effect.actor_name, every=timedelta(hours=1),
                      catch_up="all", catch_up_window=timedelta(hours=1), payload={"label": name})
    clock = DbClock(T0)
    fire_due(hourly, clock)
    clock.now = T0 + timedelta(hours=1)
    fire_due(hourly, clock)
    assert len(_ticks(name)) == 1
    every_minute = Schedule(name=name, actor_name=jobs.scheduled_effect.actor_name, every=timedelta(minutes=1),
                            catch_up="all", catch_up_window=timedelta(hours=1), payload={"label": name})
    clock.now = T0 + timedelta(hours=1, minutes=59, seconds=30)
    assert fire_due(every_minute, clock) is None  # the deploy of the new period: a fresh start
    assert len(_ticks(name)) == 1, "no burst of the new timing's ticks since the last hourly one"
    clock.now = T0 + timedelta(hours=2, seconds=1)
    fire_due(every_minute, clock)
    assert _ticks(name)[1:] == [(T0 + timedelta(hours=2), False)]
    assert ScheduleState.objects.get(name=name).timing == "every 60s start=-"


def _cron(name: str, cron: str) -> Schedule:
    return Schedule(name=name, actor_name=jobs.scheduled_effect.actor_name, cron=cron, payload={"label": name})


def test_a_timing_changed_by_a_deploy_fires_its_first_tick_after_the_deploy(name: str) -> None:
    # 03:00 daily becomes 05:00 daily, deployed at 04:00: 05:00 that day fires. The change used to
    # be seen only at 05:00, when the schedule restarted from then and dropped that tick.
    at_3, at_5 = _cron(name, "0 3 * * *"), _cron(name, "0 5 * * *")
    clock = DbClock(T0.replace(hour=2))
    fire_due(at_3, clock)
    clock.now = T0.replace(hour=3, second=1)
    fire_due(at_3, clock)
    scheduler = SchedulerComponent([at_5], clock=clock, host_clock=clock)
    for now in (T0.replace(hour=4), T0.replace(hour=4, second=1), T0.replace(hour=5, second=1)):
        clock.now = now
        scheduler.tick()
    assert _ticks(name) == [(T0.replace(hour=3), False), (T0.replace(hour=5), False)]
    state = ScheduleState.objects.get(name=name)
    assert (state.timing, state.previous_timing) == (at_5.timing, at_3.timing)


def test_in_a_rolling_deploy_the_new_timing_fires_and_hosts_with_the_old_one_leave_it(name: str) -> None:
    # Hosts with every=60s and hosts with every=30s both run rounds for three minutes: each used
    # to restart the schedule from now on its turn, and one tick fired in ten minutes.
    old = Schedule(name=name, actor_name=jobs.scheduled_effect.actor_name, every=timedelta(seconds=60),
                   payload={"label": name})
    new = Schedule(name=name, actor_name=jobs.scheduled_effect.actor_name, every=timedelta(seconds=30),
                   payload={"label": name})
    clock = DbClock(T0 - timedelta(minutes=2))
    old_host, new_host = (SchedulerComponent([declared], clock=clock, host_clock=clock) for declared in (old, new))
    deploy = T0 + timedelta(seconds=5)
    with override_settings(COMPOSITION={**settings.COMPOSITION, "DEPLOY_WINDOW_S": 300}):  # the tests' is 0
        old_host.tick()
        clock.now = T0 - timedelta(seconds=59)
        old_host.tick()
        clock.now = deploy
        new_host.tick()  # the first host with the new timing
        with capture_logs() as logs:
            while clock.now < T0 + timedelta(minutes=3, seconds=1):
                clock.now += timedelta(seconds=1)
                old_host.tick()  # first: it reaches the ticks the two timings share before the new host
                new_host.tick()
        assert [tick for tick, _ in _ticks(name) if tick > deploy] \
            == [T0 + timedelta(seconds=30 * k) for k in range(1, 7)]
        # The old host says once that it leaves the schedule, and until when: after a rollback
        # no host of the new timing is left, and nothing fires until then.
        [left] = [entry for entry in logs if entry["event"] == "schedule left to the hosts of its new timing"]
        assert (left["schedule"], left["until"]) == (name, (deploy + timedelta(seconds=300)).isoformat())
        # Past the deploy window a host with the old timing takes it back (a rollback).
        clock.now = deploy + timedelta(seconds=301)
        old_host.tick()
        assert ScheduleState.objects.get(name=name).timing == old.timing
