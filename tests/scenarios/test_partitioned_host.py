"""One of three ``runworkers`` processes, each standing for a host, is cut off from PostgreSQL and
the Redis broker (a fault proxy blackholes both: accepted, never answered, nothing refused) while
idempotent jobs stream in, then let back. The other two run its jobs once its broker heartbeat
expires: the ones it had not started within ``BROKER_HEARTBEAT_TIMEOUT_S`` + 5 s, the ones in
flight there once their open transaction ends too (the server ends it at
``DB_IDLE_IN_TRANSACTION_TIMEOUT_S``). No effect is committed twice, none is lost, no thread of
the cut-off host stays in a job past its time limit (the watchdog cuts a database call the
network never answers: ``composition.db.blocked_calls``), and the host works again once let back.

500 jobs and a 14 s cut in the gate (longer than the bound: a job held until the cut ends
fails it); 3,000 jobs and a 30 s cut under ``make soak``. The cache's Redis (worker heartbeats)
stays reachable: it is how the test watches the cut-off host's threads. Needs the test database
on TCP loopback, where the proxy can stand in front of it (CI's is)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from composition.broker.time_limits import CUT_AFTER_S
from composition.health.heartbeats import read_heartbeats
from composition.health.probes import heartbeat_client
from composition.jobs.middleware.retries import RETRY_ENQUEUE_PAUSES_S
from composition.jobs.models import DeadLetter
from composition.outbox import publish_many
from composition.testing import FaultProxy, fault_proxy, wait_until
from composition.testing.workers import current_database_url
from tests.jobsapp import jobs
from tests.jobsapp.models import Effect

# The workers' relay sends what the test publishes (to their broker, not the test process's).
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("nudge_only")]

HEARTBEAT_TIMEOUT_S = 4.0
IDLE_IN_TRANSACTION_S = 3.0
TIME_LIMIT_S = 2.0  # partition_effect's timeout_s
# Jobs a second: two hosts' 8 threads run 40 a second, so no backlog builds up during the cut.
PUBLISH_RATE = 20
# Publish to effect for a job the cut did not touch, on a busy 2-core machine.
USUAL_LATENCY_S = 3.0
# A new connection through the cut waits this long (libpq's connect_timeout, the project's
# settings), and no interrupt reaches a thread waiting in it.
CONNECT_TIMEOUT_S = 5.0
BROKER_SOCKET_TIMEOUT_S = 0.5
# A job that failed through the cut: its retry's enqueue is tried four times, one socket timeout
# each, with RETRY_ENQUEUE_PAUSES_S between them, before the thread lets it go.
RETRY_BOOKKEEPING_S = 4 * BROKER_SOCKET_TIMEOUT_S + sum(RETRY_ENQUEUE_PAUSES_S)
OVERRIDES = {"BROKER_HEARTBEAT_TIMEOUT_S": HEARTBEAT_TIMEOUT_S, "BROKER_SOCKET_TIMEOUT_S": BROKER_SOCKET_TIMEOUT_S,
             "DB_IDLE_IN_TRANSACTION_TIMEOUT_S": IDLE_IN_TRANSACTION_S,
             "WORKER_HEARTBEAT_S": 0.1}
JUST_STARTED_S = 0.12


@pytest.fixture
def database_proxy() -> Iterator[FaultProxy]:
    parts = urlsplit(current_database_url())
    if not (parts.hostname or "").startswith("127.") or parts.port is None:
        pytest.skip("the fault proxy needs the test database on TCP loopback (CI's is); this one is "
                    f"{parts.hostname or 'a Unix socket'}")
    with fault_proxy(parts.hostname or "127.0.0.1", parts.port) as proxy:
        yield proxy


@pytest.fixture
def broker_proxy(throwaway_redis_server: Any) -> Iterator[FaultProxy]:
    with fault_proxy("127.0.0.1", throwaway_redis_server.port) as proxy:
        yield proxy


class Publisher(threading.Thread):
    """Publishes ``total`` jobs through the outbox at ``PUBLISH_RATE`` a second."""

    def __init__(self, total: int) -> None:
        super().__init__(name="partition-publisher", daemon=True)
        self.keys = [f"p-{index}" for index in range(total)]
        self.duration_s = total / PUBLISH_RATE
        self.published_at: dict[str, datetime] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        from django.db import connection

        try:
            began = time.monotonic()
            batch = 10
            for start in range(0, len(self.keys), batch):
                due = began + self.duration_s * start / len(self.keys)
                time.sleep(max(0.0, due - time.monotonic()))
                keys = self.keys[start:start + batch]
                with transaction.atomic():
                    publish_many("partition_effect", [{"key": key} for key in keys])
                self.published_at.update(dict.fromkeys(keys, timezone.now()))
        except BaseException as exc:
            self.error = exc
        finally:
            connection.close()


def _beat_of(pid: int) -> dict[str, Any]:
    """The latest heartbeat of the worker process ``pid`` (empty if none is fresh)."""
    client = heartbeat_client()
    try:
        beats = read_heartbeats(client)
    finally:
        client.close()
    return next((beat for beat in beats if str(beat["worker"]).endswith(f":{pid}")), {})


def _running_one_just_started(pid: int) -> bool:
    beat, now = _beat_of(pid), time.time()
    return bool(beat) and now - beat["beat_at"] < JUST_STARTED_S and any(
        now - job["started_at"] < JUST_STARTED_S for job in beat.get("jobs") or [])


@pytest.mark.parametrize(("total", "cut_s"), [pytest.param(500, 14.0, id="gate"),
                                              pytest.param(3_000, 30.0, id="soak", marks=pytest.mark.soak)])
def test_a_host_cut_off_from_the_database_and_the_broker_loses_nothing_doubles_nothing_and_comes_back(
        throwaway_redis_server: Any, database_proxy: FaultProxy, broker_proxy: FaultProxy, worker_processes: Any,
        total: int, cut_s: float) -> None:
    # (The workers, set up last, stop first: none outlives the proxies it connects through.)
    queues = ["--threads", "4", "--queues"]
    overrides = json.dumps(OVERRIDES)
    hosts = [worker_processes.spawn([*queues, f"{jobs.PARTITION_QUEUE},composition.outbox"], TEST_HOST=name,
                                    BROKER_URL=throwaway_redis_server.url, COMPOSITION_TEST_OVERRIDES=overrides)
             for name in ("a", "b")]
    cut_host = worker_processes.spawn(
        [*queues, jobs.PARTITION_QUEUE], TEST_HOST="c", COMPOSITION_TEST_OVERRIDES=overrides,
        DATABASE_URL=database_proxy.proxied_url(current_database_url()),
        BROKER_URL=broker_proxy.proxied_url(throwaway_redis_server.url))

    def logs() -> str:
        return "\n".join(f"--- {name}:\n{worker.output()[-2500:]}"
                         for name, worker in zip("abc", [*hosts, cut_host], strict=True))

    # Before the cut, while it lasts, and after it: a steady stream, never a backlog.
    publisher = Publisher(total)
    publisher.start()
    try:
        # Cut while it runs a job: one that began within JUST_STARTED_S of a fresh beat is still
        # inside its transaction (0.2 s of sleep) when the cut lands a few milliseconds later.
        wait_until(lambda: Effect.objects.filter(host="c").count() >= 5 and _running_one_just_started(cut_host.pid),
                   60, interval_s=0.02)
    except AssertionError:
        raise AssertionError(f"the host to cut never ran jobs ({publisher.error!r}):\n{logs()}") from None

    database_proxy.blackhole()
    broker_proxy.blackhole()
    cut_at, cut_wall = time.monotonic(), timezone.now()
    # No thread of the cut-off host stays in a job past its time limit: its database call is cut
    # one second after it, the one reconnect that Django's transaction makes on its way out waits
    # out its connect timeout (no interrupt reaches a connect), and its retry's enqueue is tried
    # for a few seconds; then the thread is free.
    longest: tuple[float, str] = (0.0, "")
    while time.monotonic() < cut_at + cut_s:
        beat = _beat_of(cut_host.pid)
        assert beat, f"the cut-off host stopped beating:\n{logs()}"
        ages = [(beat["beat_at"] - job["started_at"], job["job_id"]) for job in beat.get("jobs") or []]
        longest = max([longest, *ages])
        time.sleep(0.25)
    longest_s, longest_job = longest
    assert longest_s <= TIME_LIMIT_S + CUT_AFTER_S + CONNECT_TIMEOUT_S + RETRY_BOOKKEEPING_S + 1.0, (
        f"a thread of the cut-off host stayed in job {longest_job} {longest_s:.1f} s:\n{logs()}")
    assert "its busy connections were cut" in cut_host.output(), f"no blocked call to cut:\n{logs()}"

    # Let back. The bytes the cut swallowed are gone (a real network would retransmit them once
    # healed, and the server answer or refuse): the proxy resets what it swallowed them from.
    for proxy in (database_proxy, broker_proxy):
        proxy.reset()
        proxy.pass_through()
    healed_wall = timezone.now()
    publisher.join(120)
    assert publisher.error is None, publisher.error
    # Work for the let-back host to take: on a slow machine the hosts start late, and the stream
    # can end during the cut. A few jobs at a time, until the host has run one.
    after_heal: list[str] = []

    def back_at_work() -> bool:
        if Effect.objects.filter(host="c", created_at__gt=healed_wall).exists():
            return True
        keys = [f"h-{index}" for index in range(len(after_heal), len(after_heal) + 4)]
        with transaction.atomic():
            publish_many("partition_effect", [{"key": key} for key in keys])
        after_heal.extend(keys)
        publisher.published_at.update(dict.fromkeys(keys, timezone.now()))
        return False

    try:
        wait_until(back_at_work, 60, interval_s=0.5)
    except AssertionError:
        raise AssertionError(f"the host did not work again once let back:\n{logs()}") from None
    published = len(publisher.published_at)
    try:
        wait_until(lambda: Effect.objects.values("key").distinct().count() == published, 120, interval_s=0.5)
    except AssertionError:
        lost = published - Effect.objects.values("key").distinct().count()
        raise AssertionError(f"jobs lost: {lost}\n{logs()}") from None

    doubled = list(Effect.objects.values("key").annotate(n=Count("id")).filter(n__gt=1))
    assert doubled == [], f"effects committed twice: {doubled[:10]}"
    # What the cut-off host failed ran elsewhere: no dead letter for it.
    assert list(DeadLetter.objects.values_list("payload", "error_class")) == []
    # A job ran at its usual pace, or, held by the cut-off host, within the bound after the cut:
    # its open transaction ends, the host's broker heartbeat expires, 5 s to run elsewhere.
    bound = timedelta(seconds=IDLE_IN_TRANSACTION_S + HEARTBEAT_TIMEOUT_S + 5.0)
    usual = timedelta(seconds=USUAL_LATENCY_S)
    took = {effect.key: (effect.created_at, effect.created_at - publisher.published_at[effect.key])
            for effect in Effect.objects.all()}
    late = sorted((latency.total_seconds(), key) for key, (done, latency) in took.items()
                  if latency > usual and done > cut_wall + bound and key not in after_heal)
    assert late == [], f"jobs that waited past the bound ({bound}): {late[:10]}\n{logs()}"
    held = [key for key, (done, latency) in took.items()
            if latency > timedelta(seconds=HEARTBEAT_TIMEOUT_S) and done > cut_wall]
    assert held, "no job waited on the cut-off host: the cut tested nothing"
    for worker in [*hosts, cut_host]:
        assert worker.terminate() == 0, logs()
