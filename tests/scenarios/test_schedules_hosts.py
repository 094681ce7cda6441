"""Three ``runworkers``, each standing for a host, run an every-second schedule while one of them is
SIGKILLed and restarted again and again: each tick fires exactly once (one row, one outbox
message, one effect through the inbox ledger), with no gap while a scheduler was alive, and
the tick-to-outbox lag stays under a second. The gate runs 6 s (a kill every 2 s); ``make soak``
the full minute (every 10 s)."""

from __future__ import annotations

import re
import statistics
import time
from datetime import timedelta

import pytest
from django.db.models import Count

from composition.outbox import OutboxMessage
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.schedules.models import ScheduleState, ScheduleTick
from composition.testing import wait_until
from tests.jobsapp import jobs
from tests.jobsapp.models import Effect

pytestmark = [pytest.mark.slow, pytest.mark.empty_queues(jobs.SCHEDULE_QUEUE, RELAY_QUEUE_NAME)]

NAME = "every-second"  # tests/jobsapp/schedules.py, under JOBSAPP_SCHEDULES=every-second


@pytest.fixture
def fresh_schedule(transactional_db: None) -> None:
    ScheduleState.objects.filter(name=NAME).delete()
    ScheduleTick.objects.filter(schedule=NAME).delete()
    Effect.objects.filter(key__startswith=f"{NAME}|").delete()


@pytest.mark.usefixtures("fresh_schedule")
@pytest.mark.parametrize(("duration_s", "kill_every_s"), [pytest.param(6, 2, id="gate"),
                                                          pytest.param(60, 10, id="soak", marks=pytest.mark.soak)])
def test_three_hosts_fire_every_tick_once_while_one_is_killed_again_and_again(
        worker_processes, duration_s: int, kill_every_s: int) -> None:
    args = ["--threads", "2", "--queues", f"{jobs.SCHEDULE_QUEUE},{RELAY_QUEUE_NAME}"]
    env = {"JOBSAPP_SCHEDULES": NAME}
    hosts = [worker_processes.spawn(args, **env) for _ in range(3)]
    wait_until(lambda: ScheduleTick.objects.filter(schedule=NAME).count() >= 2, timeout_s=30)
    first = ScheduleTick.objects.filter(schedule=NAME).order_by("fire_at").first()
    assert first is not None
    started = time.monotonic()
    victim = 0
    while time.monotonic() - started < duration_s:
        time.sleep(kill_every_s)
        hosts[victim].kill_group()
        hosts[victim] = worker_processes.spawn(args, **env)
        victim = (victim + 1) % len(hosts)
    last = ScheduleTick.objects.filter(schedule=NAME).order_by("-fire_at").first()
    assert last is not None
    for host in hosts:
        host.terminate()

    ticks = list(ScheduleTick.objects.filter(schedule=NAME, fire_at__gte=first.fire_at, fire_at__lte=last.fire_at)
                 .order_by("fire_at"))
    expected = int((last.fire_at - first.fire_at).total_seconds()) + 1
    assert expected >= duration_s
    # No duplicate (the constraint would refuse one anyway) and no gap: one row per second.
    assert [tick.fire_at for tick in ticks] == [first.fire_at + timedelta(seconds=k) for k in range(expected)]
    assert not ScheduleTick.objects.filter(schedule=NAME).values("fire_at").annotate(n=Count("id")).filter(n__gt=1)
    assert ScheduleState.objects.get(name=NAME).missed == 0
    lags = sorted((tick.created_at - tick.fire_at).total_seconds() for tick in ticks)
    p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
    assert p99 < 1.0, f"tick->outbox lag p99 {p99:.3f} s (median {statistics.median(lags):.3f} s)"
    # Every tick's job ran, each effect exactly once (the ledger), marked with its own tick.
    wanted = {f"{NAME}|{tick.fire_at.isoformat()}|on-time" for tick in ticks}
    survivors = [worker_processes.spawn(args)]  # no schedule here: it only finishes the runs
    try:
        wait_until(lambda: wanted <= set(Effect.objects.filter(key__startswith=f"{NAME}|")
                                         .values_list("key", flat=True)), timeout_s=60, interval_s=0.5)
    except AssertionError:
        done = set(Effect.objects.values_list("key", flat=True))
        pending = OutboxMessage.objects.filter(status="pending").count()
        pytest.fail(f"{len(wanted - done)} ticks never ran ({pending} outbox rows pending); "
                    f"log:\n{survivors[0].output()[-3000:]}")
    per_key = Effect.objects.filter(key__in=wanted).values("key").annotate(n=Count("id"))
    assert {row["n"] for row in per_key} == {1}


@pytest.mark.usefixtures("fresh_schedule")
def test_a_pause_holds_across_a_restart_of_every_host_and_resume_fires_only_the_next_tick(worker_processes) -> None:
    from composition.pauses import Pause, pause, resume

    args = ["--threads", "2", "--queues", f"{jobs.SCHEDULE_QUEUE},{RELAY_QUEUE_NAME}"]
    env = {"JOBSAPP_SCHEDULES": NAME}
    pause(Pause.SCHEDULE, NAME, by="test", reason="held across restarts")
    try:
        hosts = [worker_processes.spawn(args, **env) for _ in range(2)]
        wait_until(lambda: ScheduleState.objects.filter(name=NAME, paused__gte=2).exists(), timeout_s=30)
        for host in hosts:  # every host stopped: the pause is only in the database now
            host.terminate()
        paused_through = ScheduleState.objects.get(name=NAME).watermark
        host = worker_processes.spawn(args, **env)
        wait_until(lambda: ScheduleState.objects.get(name=NAME).watermark > paused_through + timedelta(seconds=1),
                   timeout_s=30)  # the restarted host counts ticks as paused, fires none
        assert not ScheduleTick.objects.filter(schedule=NAME).exists()
        resumed = resume(Pause.SCHEDULE, NAME, by="test")[0].changed_at
        wait_until(lambda: ScheduleTick.objects.filter(schedule=NAME).exists(), timeout_s=30)
        host.terminate()
    finally:
        resume(Pause.SCHEDULE, NAME, by="test")
    first = ScheduleTick.objects.filter(schedule=NAME).order_by("fire_at").first()
    assert first is not None and first.fire_at > paused_through and not first.catch_up
    # Nothing due while paused fired: the first tick is the one after the resume (within a second).
    assert first.fire_at >= resumed - timedelta(seconds=1)


@pytest.mark.usefixtures("fresh_schedule")
def test_under_processes_n_the_supervisor_runs_the_host_s_one_scheduler(worker_processes) -> None:
    args = ["--processes", "2", "--threads", "2", "--queues", f"{jobs.SCHEDULE_QUEUE},{RELAY_QUEUE_NAME}"]
    host = worker_processes.spawn(args, JOBSAPP_SCHEDULES=NAME)
    wait_until(lambda: ScheduleTick.objects.filter(schedule=NAME).count() >= 2, timeout_s=40)
    wanted = {f"{NAME}|{tick.fire_at.isoformat()}|on-time" for tick in ScheduleTick.objects.filter(schedule=NAME)}
    wait_until(lambda: wanted <= set(Effect.objects.values_list("key", flat=True)), timeout_s=30)
    # Both children up (their logs are in the same output: two worker components started); on a
    # slow machine the second may still be starting when the first has run the ticks.
    workers_started = r'"component": "workers", .*"event": "component started"'
    wait_until(lambda: len(re.findall(workers_started, host.output())) == 2, timeout_s=30,
               message=host.output()[-3000:])
    assert host.terminate() == 0
    # One scheduler for the host: the supervisor's; its two children were started without one.
    output = host.output()
    assert output.count("scheduler started") == 1, output[-3000:]
