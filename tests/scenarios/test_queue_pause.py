"""Pausing a queue with real worker processes, each standing for a host: ``queues pause`` returns
and no job of the queue starts anywhere later than a second after it, prefetched messages
included; what was published meanwhile runs after ``queues resume``, each effect once (the
ledger); a pause holds across a restart of every host. On RabbitMQ, a job running at the pause
is not run a second time (its consumer unsubscribes; Dramatiq's pause would close the
connection and have RabbitMQ redeliver it). The gate pauses 3 times on Redis; ``make soak`` 20.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import transaction

from composition import health
from composition.jobs.models import ProcessedMessage
from composition.outbox import OutboxMessage, publish
from composition.outbox.models import message_id_for
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.pauses import Pause
from composition.testing import WorkerProcess, wait_until
from tests.helpers import RABBITMQ_URL
from tests.jobsapp import jobs
from tests.jobsapp.models import Effect

pytestmark = [pytest.mark.slow, pytest.mark.empty_queues(jobs.PAUSE_QUEUE, RELAY_QUEUE_NAME)]

# A job's start later than this after `queues pause` returned breaks the promise.
PAUSE_TAKES_S = 1.0


@pytest.fixture
def starts(transactional_db: None) -> Iterator[dict[str, list[float]]]:
    """Every start of a ``pause_effect`` run of this test: key -> the times it started."""
    client = jobs.pause_starts_client()
    client.delete(jobs.PAUSE_STARTS_KEY)
    Pause.objects.filter(kind=Pause.QUEUE, name=jobs.PAUSE_QUEUE).delete()

    class Starts(dict):  # type: ignore[type-arg]
        def read(self) -> dict[str, list[float]]:
            self.clear()
            for entry in client.lrange(jobs.PAUSE_STARTS_KEY, 0, -1):
                key, at = entry.decode().split()
                self.setdefault(key, []).append(float(at))
            return self

    yield Starts()
    client.delete(jobs.PAUSE_STARTS_KEY)
    client.close()
    Pause.objects.filter(kind=Pause.QUEUE, name=jobs.PAUSE_QUEUE).delete()


def _publish(keys: list[str], hold_s: float, job: str = "pause_effect") -> None:
    with transaction.atomic():
        for key in keys:
            publish(job, {"key": key, "hold_s": hold_s})


def _pause() -> float:
    call_command("queues", "pause", jobs.PAUSE_QUEUE, "--reason", "test", "--by", "tests")
    return time.time()


def _resume() -> None:
    call_command("queues", "resume", jobs.PAUSE_QUEUE, "--by", "tests")


def _late_starts(starts: dict[str, list[float]], paused_at: float) -> list[tuple[str, float]]:
    return sorted((key, at - paused_at) for key, times in starts.read().items() for at in times
                  if at > paused_at + PAUSE_TAKES_S)


def _effects(prefix: str) -> Counter[str]:
    return Counter(Effect.objects.filter(key__startswith=prefix).values_list("key", flat=True))


def _logs(hosts: list[WorkerProcess]) -> str:
    return "\n".join(host.output()[-1500:] for host in hosts)


def _every_host_beats_with_the_pause(hosts: list[WorkerProcess]) -> bool:
    beats = {int(beat["worker"].rsplit(":", 1)[1]): beat for beat in health.workers().detail.get("workers", [])}
    return all(beats.get(host.pid, {}).get("paused_queues") == [jobs.PAUSE_QUEUE] for host in hosts)


def _wait_for_starts(starts: Any, count: int, hosts: list[WorkerProcess]) -> None:
    wait_until(lambda: len(starts.read()) >= count, timeout_s=30, message=_logs(hosts))


def _wait_for_effects(run: str, keys: list[str], hosts: list[WorkerProcess], timeout_s: float = 30) -> None:
    expected = set(keys)
    wait_until(lambda: expected <= set(_effects(run)), timeout_s=timeout_s, message=_logs(hosts))


@pytest.mark.parametrize("tries", [pytest.param(3, id="gate"), pytest.param(20, id="soak", marks=pytest.mark.soak)])
def test_a_paused_queue_starts_nothing_on_any_host_within_a_second_and_loses_nothing(
        worker_processes, starts, tries: int) -> None:  # type: ignore[no-untyped-def]
    args = ["--threads", "4", "--queues", f"{jobs.PAUSE_QUEUE},{RELAY_QUEUE_NAME}"]
    hosts = [worker_processes.spawn(args) for _ in range(3)]
    run = uuid.uuid4().hex[:8]
    published: list[str] = []
    for attempt in range(tries):
        # Every thread of every host busy for 1.5 s, and as many messages prefetched behind them:
        # without the hand-back those would start up to 1.5 s after the pause.
        busy = [f"{run}-{attempt}-busy-{index}" for index in range(24)]
        _publish(busy, hold_s=1.5)
        published += busy
        _wait_for_starts(starts, len(published) - 12, hosts)
        paused_at = _pause()
        meanwhile = [f"{run}-{attempt}-meanwhile-{index}" for index in range(10)]
        _publish(meanwhile, hold_s=0.0)
        published += meanwhile
        time.sleep(PAUSE_TAKES_S + 0.8)
        assert not _late_starts(starts, paused_at), (attempt, _late_starts(starts, paused_at))
        _resume()
        _wait_for_effects(run, published, hosts)

    # A pause set before a restart of every host holds after it.
    _pause()
    for host in hosts:
        assert host.terminate() == 0, host.output()[-3000:]
    after_restart = [f"{run}-restart-{index}" for index in range(20)]
    _publish(after_restart, hold_s=0.0)
    published += after_restart
    restarted_at = time.time()
    hosts = [worker_processes.spawn(args) for _ in range(3)]
    wait_until(lambda: not OutboxMessage.objects.filter(queue_name=jobs.PAUSE_QUEUE, status="pending").exists(),
               timeout_s=30, message=_logs(hosts))  # relayed: the messages wait on the broker
    time.sleep(PAUSE_TAKES_S + 2.0)  # the hosts are up and consuming their other queue
    assert not any(key in starts.read() for key in after_restart), _logs(hosts)
    assert all(at < restarted_at for times in starts.values() for at in times)
    # Idle on purpose, not stuck: healthy, and every host says it has read the pause.
    wait_until(lambda: _every_host_beats_with_the_pause(hosts), timeout_s=30, message=str(health.workers().as_dict()))
    report = health.workers()
    assert report.ok and report.detail["stuck"] == [], report.as_dict()
    _resume()
    _wait_for_effects(run, published, hosts)
    for host in hosts:
        assert host.terminate() == 0, host.output()[-3000:]

    effects = _effects(run)
    assert set(effects) == set(published) and set(effects.values()) == {1}, effects.most_common(3)
    message_ids = [message_id_for(pk) for pk in
                   OutboxMessage.objects.filter(queue_name=jobs.PAUSE_QUEUE).values_list("pk", flat=True)]
    assert len(message_ids) == len(published)
    assert ProcessedMessage.objects.filter(message_id__in=message_ids).count() == len(published)


@pytest.mark.rabbitmq
# nudge_only: the hosts relay over RabbitMQ; this process's broker is Redis.
@pytest.mark.empty_queues(jobs.PAUSE_QUEUE, rabbitmq=True)
@pytest.mark.usefixtures("nudge_only")
def test_on_rabbitmq_a_job_running_at_the_pause_runs_once_and_the_rest_wait(
        worker_processes, starts) -> None:  # type: ignore[no-untyped-def]
    args = ["--threads", "2", "--queues", f"{jobs.PAUSE_QUEUE},{RELAY_QUEUE_NAME}", "--shutdown-timeout", "10"]
    hosts = [worker_processes.spawn(args, BROKER_URL=RABBITMQ_URL) for _ in range(2)]
    run = uuid.uuid4().hex[:8]
    # Two hosts of two threads: 4 running for 1.5 s, 4 prefetched behind them, 8 on the queue.
    # Without the ledger (pause_run), so that a second delivery would run a second time.
    keys = [f"{run}-{index}" for index in range(16)]
    _publish(keys, hold_s=1.5, job="pause_run")
    wait_until(lambda: len(starts.read()) >= 4, timeout_s=60, message=_logs(hosts))
    paused_at = _pause()
    running_at_pause = {key for key in starts.read() if key.startswith(run)}
    time.sleep(PAUSE_TAKES_S + 1.0)  # the runs going at the pause end meanwhile
    assert not _late_starts(starts, paused_at), _late_starts(starts, paused_at)
    assert set(_effects(run)) >= running_at_pause  # they finished, and were acknowledged
    _resume()
    _wait_for_effects(run, keys, hosts, timeout_s=60)
    for host in hosts:
        assert host.terminate(20) == 0, host.output()[-3000:]
    assert {key: len(times) for key, times in starts.read().items() if len(times) > 1} == {}
    assert set(_effects(run).values()) == {1}
