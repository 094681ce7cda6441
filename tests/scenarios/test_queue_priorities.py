"""Priorities between queues with a real ``runworkers`` host: under ``--queues
jobs_critical=4,jobs_bulk=1`` critical jobs start within a second and a half of their publication
while the bulk queue is full of one-second jobs, and the bulk jobs still all run; under a strict
``--queues jobs_critical,jobs_bulk`` every critical job waiting starts before the next bulk one.
Dramatiq's own order runs the bulk work fetched before them first. The gate sends 20 critical
jobs; ``make soak`` sends them for two minutes.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings

from composition.conf import conf
from composition.errors import ConfigurationError
from composition.jobs.queue_order import QueueOrder
from composition.lifecycle.workers import WorkerOptions, child_argv
from composition.outbox import publish
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.testing import WorkerProcess, subprocess_env, wait_until
from tests.helpers import ROOT
from tests.jobsapp import jobs
from tests.jobsapp.models import Effect

pytestmark = [pytest.mark.slow, pytest.mark.empty_queues(jobs.CRITICAL_QUEUE, jobs.BULK_QUEUE, RELAY_QUEUE_NAME)]

# The promise: a critical job starts this soon after its publication, bulk queue full or not.
CRITICAL_P99_S = 1.5
BULK_HOLD_S = 1.0
CRITICAL_EVERY_S = 0.2


@dataclass(frozen=True)
class Start:
    kind: str  # "critical" or "bulk"
    key: str
    at: float  # time.time() of the start
    latency_s: float | None  # critical only: from publication to start


class Starts:
    """The starts the priority jobs noted in Redis (``jobs.PRIORITY_STARTS_KEY``)."""

    def __init__(self) -> None:
        self.client = jobs.pause_starts_client()
        self.client.delete(jobs.PRIORITY_STARTS_KEY)

    def read(self, published: dict[str, float]) -> list[Start]:
        """Every start so far, oldest first; ``published`` maps a critical key to its publication."""
        starts = []
        for entry in self.client.lrange(jobs.PRIORITY_STARTS_KEY, 0, -1):
            kind, key, number = entry.decode().split()
            if kind == "critical":
                starts.append(Start(kind, key, published[key] + float(number), float(number)))
            else:
                starts.append(Start(kind, key, float(number), None))
        return sorted(starts, key=lambda start: start.at)

    def close(self) -> None:
        self.client.delete(jobs.PRIORITY_STARTS_KEY)
        self.client.close()


@pytest.fixture
def starts(transactional_db: None) -> Iterator[Starts]:
    noted = Starts()
    yield noted
    noted.close()


def _publish_bulk(keys: list[str], hold_s: float = BULK_HOLD_S) -> None:
    with transaction.atomic():
        for key in keys:
            publish(jobs.bulk_step, {"key": key, "hold_s": hold_s})


def _publish_critical(key: str) -> float:
    published_at = time.time()
    with transaction.atomic():
        publish(jobs.critical_step, {"key": key, "published_at": published_at})
    return published_at


def _effects(run: str) -> set[str]:
    return set(Effect.objects.filter(key__startswith=run).values_list("key", flat=True))


def _order_logged(host: WorkerProcess) -> dict[str, object]:
    """The host's one line saying in what order its threads take work."""
    for line in host.output().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "worker threads take work in queue order":
            return dict(record)
    raise AssertionError(f"no queue order logged:\n{host.output()[-3000:]}")


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]


@pytest.mark.parametrize(("critical_jobs", "bulk_jobs"), [
    pytest.param(20, 16, id="gate"),
    # Two minutes of critical jobs; one bulk thread runs a job a second, so 130 keep it full.
    pytest.param(int(120 / CRITICAL_EVERY_S), 130, id="soak", marks=pytest.mark.soak),
])
def test_critical_jobs_start_within_1_5_s_while_bulk_work_fills_the_host_and_bulk_work_still_runs(
        worker_processes: Any, starts: Starts, critical_jobs: int, bulk_jobs: int) -> None:
    # Four threads, three kept for the critical queue (4 * 4 // 5): bulk work runs on one.
    host: WorkerProcess = worker_processes.spawn(
        ["--threads", "4", "--queues", f"{jobs.CRITICAL_QUEUE}=4,{jobs.BULK_QUEUE}=1,{RELAY_QUEUE_NAME}"])
    run = uuid.uuid4().hex[:8]
    bulk = [f"{run}-bulk-{index}" for index in range(bulk_jobs)]
    _publish_bulk(bulk)
    published: dict[str, float] = {}
    wait_until(lambda: starts.read(published), timeout_s=30, message=host.output()[-3000:])

    began = time.time()
    for index in range(critical_jobs):
        key = f"{run}-critical-{index}"
        published[key] = _publish_critical(key)
        time.sleep(max(0.0, began + (index + 1) * CRITICAL_EVERY_S - time.time()))
    ended = time.time()
    wait_until(lambda: set(published) <= _effects(run), timeout_s=30, message=host.output()[-3000:])
    seen = starts.read(published)
    latencies = [start.latency_s for start in seen if start.latency_s is not None]
    bulk_meanwhile = [start for start in seen if start.kind == "bulk" and began <= start.at <= ended]
    assert len(latencies) == critical_jobs
    print(f"critical start latency: p50 {sorted(latencies)[len(latencies) // 2]:.3f} s, "
          f"p99 {_p99(latencies):.3f} s, max {max(latencies):.3f} s over {critical_jobs} jobs; "
          f"{len(bulk_meanwhile)} bulk jobs started meanwhile")
    assert _p99(latencies) < CRITICAL_P99_S, sorted(latencies)[-5:]
    assert len(_effects(run) & set(bulk)) < bulk_jobs, "the bulk queue ran empty before the critical jobs ended"
    # Not starved: the bulk thread went on running bulk work between the critical jobs.
    assert len(bulk_meanwhile) >= (ended - began) / BULK_HOLD_S / 2, len(bulk_meanwhile)

    wait_until(lambda: set(bulk) <= _effects(run), timeout_s=bulk_jobs * BULK_HOLD_S + 30,
               message=host.output()[-3000:])
    assert host.terminate() == 0, host.output()[-3000:]
    logged = _order_logged(host)
    assert (logged["mode"], logged["reserved_for_first_queue"]) == ("weighted", 3), logged


def test_in_strict_order_every_waiting_critical_job_starts_before_the_next_bulk_job(
        worker_processes: Any, starts: Starts) -> None:
    host: WorkerProcess = worker_processes.spawn(
        ["--threads", "2", "--queues", f"{jobs.CRITICAL_QUEUE},{jobs.BULK_QUEUE},{RELAY_QUEUE_NAME}"])
    run = uuid.uuid4().hex[:8]
    # Both threads busy for the hold, and more bulk work fetched behind them before the critical.
    # Held twice the usual: the criticals must all be on the host before a thread is free, even
    # when the machine is slow to note the first starts.
    bulk = [f"{run}-bulk-{index}" for index in range(8)]
    _publish_bulk(bulk, hold_s=2 * BULK_HOLD_S)
    published: dict[str, float] = {}
    wait_until(lambda: len(starts.read(published)) >= 2, timeout_s=30, message=host.output()[-3000:])
    critical_at = time.time()
    # As many as the host fetches of a queue at once (two per thread), in one transaction, so one
    # send: the order is kept among the messages a host holds, and a further one waits on the
    # broker meanwhile (published one by one, the last could come after a thread took bulk work).
    with transaction.atomic():
        for index in range(4):
            key = f"{run}-critical-{index}"
            published[key] = time.time()
            publish(jobs.critical_step, {"key": key, "published_at": published[key]})
    wait_until(lambda: set(published) | set(bulk) <= _effects(run), timeout_s=60, message=host.output()[-3000:])
    assert host.terminate() == 0, host.output()[-3000:]

    after = [start.kind for start in starts.read(published) if start.at > critical_at]
    assert after == ["critical"] * 4 + ["bulk"] * (len(after) - 4), after
    assert _order_logged(host)["mode"] == "strict"


# The wiring: the setting and the command line say the same, and a supervisor's children get it.


def test_a_bad_order_on_the_command_line_is_a_usage_error() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "runworkers", "--queues", "a=4,b"], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--queues: 'a=4,b' mixes weighted and unweighted queues" in done.stderr


def test_the_setting_takes_a_list_and_the_children_get_the_weighted_order() -> None:
    order = ["critical=4", "bulk=1", RELAY_QUEUE_NAME]
    with override_settings(COMPOSITION={**conf.as_dict(), "WORKER_QUEUES": order, "WORKER_PROCESSES": 2}):
        options = WorkerOptions.from_settings()
    assert options.queue_order == QueueOrder.parse(order)
    argv = child_argv(options)
    assert argv[argv.index("--queues") + 1] == f"{RELAY_QUEUE_NAME},critical=4,bulk=1"
    with override_settings(COMPOSITION={**conf.as_dict(), "WORKER_QUEUES": ["critical=0", "bulk=1"]}), \
            pytest.raises(ConfigurationError, match=r"WORKER_QUEUES.*at least 1"):
        WorkerOptions.from_settings()
