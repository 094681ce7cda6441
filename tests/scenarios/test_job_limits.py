"""Job limits with real worker processes on one PostgreSQL and one Redis, each process standing
for a host. ``@job(concurrency=5)``: the runs going at once, sampled every 100 ms from what the
job bodies themselves note, never exceed 5, a host SIGKILLed midway gives its slots back within
the TTL, and nothing waits through the retry path: no limited job is retried or dead-lettered.
``@job(rate="50/5s")``: no 5 s window of the Redis server's clock holds more than 50 starts, and
the allowed starts are used. The gate runs short versions; ``make soak`` the two minutes of the
issue. Throughput against unlimited threads is measured in bench/bench_limits.py.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from django.db import transaction

from composition.jobs.models import DeadLetter
from composition.limits import limit_store
from composition.outbox import publish
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.testing import WorkerProcess, wait_until
from tests.helpers import RABBITMQ_URL
from tests.jobsapp import jobs
from tests.jobsapp.models import Effect

pytestmark = [pytest.mark.slow, pytest.mark.empty_queues(jobs.LIMIT_QUEUE, RELAY_QUEUE_NAME)]

SLOT_TTL_S = 3.0
WORKERS_STARTED = re.compile(r'"component": "workers", .*"event": "component started"')
HOST_ENV = {"COMPOSITION_TEST_OVERRIDES": json.dumps({"LIMIT_SLOT_TTL_S": SLOT_TTL_S})}


@pytest.fixture
def notes(transactional_db: None) -> Iterator[object]:
    """The bodies' notes and the limits' state, from nothing, on the cache's Redis."""
    store = limit_store()
    keys = [jobs.LIMIT_RUNNING_KEY, jobs.LIMIT_STARTS_KEY] + [
        f"{store.prefix}{actor}:{name}" for actor in ("limited_call", "rated_call")
        for name in ("slots", "started", "starts", "meta")]
    client = jobs.pause_starts_client()
    client.delete(*keys)
    yield client
    client.delete(*keys)
    client.close()


class RunningSampler(threading.Thread):
    """The runs going at once, from the bodies' own notes, every 100 ms; a SIGKILLed host's runs
    stopped at the kill (``forget``), although their notes stay."""

    def __init__(self, client: object) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.dead_pids: set[str] = set()
        self.samples: list[int] = []
        self.stopping = threading.Event()

    def forget(self, pid: int) -> None:
        self.dead_pids.add(str(pid))

    def run(self) -> None:
        while not self.stopping.wait(0.1):
            members = [raw.decode() for raw in self.client.smembers(jobs.LIMIT_RUNNING_KEY)]  # type: ignore[attr-defined]
            self.samples.append(sum(1 for member in members if member.split(":", 1)[0] not in self.dead_pids))


def _publish(job: str, keys: list[str], hold_s: float) -> None:
    for start in range(0, len(keys), 100):
        with transaction.atomic():
            for key in keys[start:start + 100]:
                publish(job, {"key": key, "hold_s": hold_s})


def _starts(client: object, run: str) -> list[tuple[str, float, int]]:
    entries = [raw.decode().split() for raw in client.lrange(jobs.LIMIT_STARTS_KEY, 0, -1)]  # type: ignore[attr-defined]
    return [(key, float(at), int(retries)) for key, at, retries in entries if key.startswith(run)]


def _logs(hosts: list[WorkerProcess]) -> str:
    return "\n".join(host.output()[-1500:] for host in hosts)


def _taking_work(hosts: list[WorkerProcess]) -> list[WorkerProcess]:
    """``hosts``, once each one's worker threads have started (its last component). Work published
    before then can all go to the first host up, whose threads alone never reach the limit."""
    wait_until(lambda: all(WORKERS_STARTED.search(host.output()) for host in hosts), timeout_s=60,
               message=_logs(hosts))
    return hosts


def _done(run: str) -> Counter[str]:
    return Counter(Effect.objects.filter(key__startswith=run).values_list("key", flat=True))


@pytest.mark.parametrize(("jobs_count", "hold_s", "threads", "kill_after_s"), [
    pytest.param(40, 1.0, 4, 3.0, id="gate"),
    pytest.param(320, 2.0, 8, 60.0, id="soak", marks=pytest.mark.soak),
])
def test_concurrency_never_exceeds_the_limit_and_a_killed_host_gives_its_slots_back(
        worker_processes, notes, jobs_count: int, hold_s: float, threads: int,  # type: ignore[no-untyped-def]
        kill_after_s: float) -> None:
    args = ["--threads", str(threads), "--queues", f"{jobs.LIMIT_QUEUE},{RELAY_QUEUE_NAME}"]
    hosts = _taking_work([worker_processes.spawn(args, **HOST_ENV) for _ in range(3)])
    run = uuid.uuid4().hex[:8]
    keys = [f"{run}-{index}" for index in range(jobs_count)]
    sampler = RunningSampler(notes)
    sampler.start()
    _publish("limited_call", keys, hold_s)
    wait_until(lambda: len(_starts(notes, run)) >= 5, timeout_s=30, message=_logs(hosts))
    time.sleep(kill_after_s)
    victim = next((host for host in hosts if any(m.decode().startswith(f"{host.pid}:")
                                                for m in notes.smembers(jobs.LIMIT_RUNNING_KEY))), hosts[0])
    victim.kill_group()
    killed_at = time.monotonic()
    sampler.forget(victim.pid)
    # Its slots come back within the TTL: 5 runs go at once again on the two others.
    wait_until(lambda: sampler.samples and sampler.samples[-1] == jobs.LIMIT_CONCURRENCY,
               timeout_s=SLOT_TTL_S + 3 * hold_s, message=_logs(hosts))
    back_after_s = time.monotonic() - killed_at
    wait_until(lambda: set(_done(run)) == set(keys), timeout_s=30 + jobs_count * hold_s / 4, message=_logs(hosts))
    sampler.stopping.set()
    sampler.join()
    survivors = [host for host in hosts if host is not victim]
    for host in survivors:
        assert host.terminate() == 0, host.output()[-3000:]

    assert max(sampler.samples) <= jobs.LIMIT_CONCURRENCY, Counter(sampler.samples)
    assert max(sampler.samples) == jobs.LIMIT_CONCURRENCY  # the limit was reached, not just respected
    assert back_after_s <= SLOT_TTL_S + hold_s + 1.0, back_after_s
    assert set(_done(run).values()) == {1}
    starts = _starts(notes, run)
    assert all(retries == 0 for _, _, retries in starts), [s for s in starts if s[2]]  # never through retries
    assert not DeadLetter.objects.filter(actor="limited_call").exists()
    again = {key for key, count in Counter(key for key, _, _ in starts).items() if count > 1}
    assert len(again) <= threads, again  # only what the killed host was running ran twice
    state = limit_store().state("limited_call", jobs.limited_call.options["job_limits"])
    assert state.slots_held == 0 and state.delayed_by_concurrency > 0


def _most_in_a_window(times: list[float], window_s: float) -> int:
    times = sorted(times)
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= window_s:
            first += 1
        most = max(most, last - first + 1)
    return most



@pytest.mark.parametrize(("jobs_count", "seconds"), [
    pytest.param(120, None, id="gate"),
    pytest.param(1400, 120.0, id="soak", marks=pytest.mark.soak),
])
def test_no_window_of_the_redis_clock_holds_more_starts_than_the_rate_and_the_rate_is_used(
        worker_processes, notes, jobs_count: int, seconds: float | None) -> None:  # type: ignore[no-untyped-def]
    args = ["--threads", "4", "--queues", f"{jobs.LIMIT_QUEUE},{RELAY_QUEUE_NAME}"]
    hosts = _taking_work([worker_processes.spawn(args, **HOST_ENV) for _ in range(3)])
    run = uuid.uuid4().hex[:8]
    keys = [f"{run}-{index}" for index in range(jobs_count)]
    _publish("rated_call", keys, 0.05)
    allowed, window_s = 50, 5.0
    if seconds is None:
        wait_until(lambda: set(_done(run)) == set(keys), timeout_s=60, message=_logs(hosts))
    else:
        wait_until(lambda: len(_starts(notes, run)) >= 1, timeout_s=30, message=_logs(hosts))
        time.sleep(seconds)
    for host in hosts:
        assert host.terminate() == 0, host.output()[-3000:]
    times = sorted(at for _, at, _ in _starts(notes, run))
    # Each start at its admission's time on the Redis server's clock (the body notes it).
    assert _most_in_a_window(times, window_s) <= allowed
    assert not DeadLetter.objects.filter(actor="rated_call").exists()
    if seconds is None:
        # 120 starts at 50 per 5 s: 50 at once, 50 five seconds later, 20 after ten.
        assert times[-1] - times[0] < 2 * window_s + 1.5, times[-1] - times[0]
    else:
        first = times[0]
        used = sum(1 for at in times if at < first + seconds)
        assert used >= 0.9 * allowed * seconds / window_s, used


def test_a_message_put_back_to_wait_for_a_deploy_hands_its_rate_start_back(worker_processes, notes) -> None:  # type: ignore[no-untyped-def]
    # Messages of a newer job version than the host's code wait out the deploy window, coming
    # back every few seconds: each return used to log a start, so during a rolling deploy they
    # spent the job's rate (50 per 5 s here) and held back the messages the host can run.
    host = worker_processes.spawn(["--threads", "4", "--queues", f"{jobs.LIMIT_QUEUE},{RELAY_QUEUE_NAME}"],
                                  COMPOSITION_TEST_OVERRIDES=json.dumps({"DEPLOY_WINDOW_S": 60}))
    run = uuid.uuid4().hex[:8]
    for index in range(3):
        jobs.rated_call.send_with_options(kwargs={"key": f"{run}-newer-{index}", "hold_s": 0}, job_version=99)
    wait_until(lambda: "the running code cannot run this message; it waits for the deploy" in host.output(),
               timeout_s=30, message=_logs([host]))
    limits = jobs.rated_call.options["job_limits"]
    wait_until(lambda: limit_store().state("rated_call", limits).starts_in_window == 0, timeout_s=2,
               message="the refused runs' starts are still counted in the rate's window")
    _publish("rated_call", [f"{run}-now"], 0)
    wait_until(lambda: _done(run) == Counter({f"{run}-now": 1}), timeout_s=30, message=_logs([host]))
    assert host.terminate() == 0, host.output()[-3000:]


@pytest.mark.rabbitmq
# nudge_only: the hosts relay over RabbitMQ; this process's broker is Redis.
@pytest.mark.empty_queues(jobs.LIMIT_QUEUE, rabbitmq=True)
@pytest.mark.usefixtures("nudge_only")
def test_on_rabbitmq_the_limit_holds_and_the_waiting_ones_come_back_through_its_delay_queue(
        worker_processes, notes) -> None:  # type: ignore[no-untyped-def]
    args = ["--threads", "4", "--queues", f"{jobs.LIMIT_QUEUE},{RELAY_QUEUE_NAME}"]
    hosts = _taking_work([worker_processes.spawn(args, BROKER_URL=RABBITMQ_URL, **HOST_ENV) for _ in range(2)])
    run = uuid.uuid4().hex[:8]
    keys = [f"{run}-{index}" for index in range(20)]
    sampler = RunningSampler(notes)
    sampler.start()
    _publish("limited_call", keys, 0.5)
    wait_until(lambda: set(_done(run)) == set(keys), timeout_s=60, message=_logs(hosts))
    sampler.stopping.set()
    sampler.join()
    for host in hosts:
        assert host.terminate(20) == 0, host.output()[-3000:]
    assert max(sampler.samples) <= jobs.LIMIT_CONCURRENCY, Counter(sampler.samples)
    assert set(_done(run).values()) == {1}
    starts = _starts(notes, run)
    assert len(starts) == len(keys) and all(retries == 0 for _, _, retries in starts)
    assert limit_store().state("limited_call", jobs.limited_call.options["job_limits"]).delayed_by_concurrency > 0
