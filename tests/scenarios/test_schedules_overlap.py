"""``overlap="skip"`` with real processes: a job of 1.5 s on an every-second schedule never runs
twice at once; the ticks it held back are counted as skipped; two hosts run the scheduler; a run
that skips itself frees its schedule."""

from __future__ import annotations

from itertools import pairwise

import pytest

from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.schedules.models import ScheduleState, ScheduleTick
from composition.testing import wait_until
from tests.jobsapp import jobs
from tests.jobsapp.models import Effect

pytestmark = [pytest.mark.slow, pytest.mark.empty_queues(jobs.SCHEDULE_QUEUE, RELAY_QUEUE_NAME)]

NAME = "overlap"  # tests/jobsapp/schedules.py, under JOBSAPP_SCHEDULES=overlap


def forget(name: str) -> None:
    """No state, tick or effect of the schedule ``name`` left by an earlier run."""
    ScheduleState.objects.filter(name=name).delete()
    ScheduleTick.objects.filter(schedule=name).delete()
    Effect.objects.filter(key__startswith=f"{name}|").delete()


def test_a_run_longer_than_its_period_never_overlaps_and_held_back_ticks_are_skipped(
        transactional_db: None, worker_processes) -> None:
    forget(NAME)
    args = ["--threads", "4", "--queues", f"{jobs.SCHEDULE_QUEUE},{RELAY_QUEUE_NAME}"]
    hosts = [worker_processes.spawn(args, JOBSAPP_SCHEDULES=NAME) for _ in range(2)]
    wait_until(lambda: Effect.objects.filter(key__startswith=f"{NAME}|end|").count() >= 2, timeout_s=40)
    for host in hosts:
        host.terminate()
    marks = {effect.key: effect.created_at for effect in Effect.objects.filter(key__startswith=f"{NAME}|")}
    runs = sorted((marks[key], marks.get(key.replace("|start|", "|end|")))
                  for key in marks if "|start|" in key)
    for (_, first_end), (second_start, _) in pairwise(runs):
        assert first_end is not None and first_end <= second_start, runs
    state = ScheduleState.objects.get(name=NAME)
    ended = sum(1 for _, end in runs if end is not None)
    # The tick during each run, at least; but the last run may end after the schedulers stopped
    # evaluating ticks (the hosts stop while it runs), and its tick is then never counted.
    assert state.skipped >= ended - 1 >= 1, (state.skipped, runs)
    assert state.missed == 0
    # Every tick that fired has ended (its run reported back through job_run_ended), but for the
    # last: with overlap="skip" only it can still have been waiting when the hosts stopped.
    assert not ScheduleTick.objects.filter(schedule=NAME, finished_at__isnull=True).exclude(
        fire_at=ScheduleTick.objects.filter(schedule=NAME).order_by("-fire_at").values("fire_at")[:1])


SKIPPING = "skipping"  # tests/jobsapp/schedules.py, under JOBSAPP_SCHEDULES=skipping


def test_a_run_that_skips_itself_ends_its_tick_and_the_next_tick_fires(
        transactional_db: None, worker_processes) -> None:
    # A run that ends in Dramatiq's SkipMessage is over (acknowledged, never retried): held as
    # still running, it kept an overlap="skip" schedule from firing for its time limit plus 30 s.
    forget(SKIPPING)
    host = worker_processes.spawn(["--threads", "2", "--queues", f"{jobs.SCHEDULE_QUEUE},{RELAY_QUEUE_NAME}"],
                                  JOBSAPP_SCHEDULES=SKIPPING)
    wait_until(lambda: Effect.objects.filter(key__startswith=f"{SKIPPING}|run|").count() >= 3, timeout_s=20)
    host.terminate()
    ended = ScheduleTick.objects.filter(schedule=SKIPPING, finished_at__isnull=False).count()
    assert ended >= 2, list(ScheduleTick.objects.filter(schedule=SKIPPING).values("fire_at", "finished_at"))
