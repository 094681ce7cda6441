"""Quorum queues on a cluster: three real RabbitMQ nodes on this machine (ThrowawayRabbitCluster,
one for the module), a quorum queue that keeps every confirmed message when its leader's node
stops, idempotent jobs through the outbox and ``runworkers`` that run once each while the node of
their queue's leader stops and starts again, and the machine's own node (``rabbit@localhost``,
CI's service) left exactly as it was. 1,000 jobs in the gate, 5,000 under ``make soak``."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import psutil
import pytest

from composition.testing import ThrowawayRabbitCluster, throwaway_rabbit_cluster
from composition.testing.rabbitmq_layout import RABBITMQ_BIN_DIR
from tests.browser import tool_missing
from tests.helpers import RABBITMQ_URL, next_message

pytestmark = [pytest.mark.slow, pytest.mark.rabbitmq]

SHARED_NODE = "rabbit@localhost"
MESSAGES = 100


def _shared_node(tool: str, *args: str) -> str:
    # Debian's wrapper (/usr/sbin) runs the CLI as the rabbitmq user, with that node's cookie.
    binary = shutil.which(tool, path="/usr/sbin:/usr/bin") or tool
    return subprocess.run([binary, "-n", SHARED_NODE, *args], capture_output=True, text=True, timeout=60,
                          check=True).stdout


def _shared_uptime_s() -> int:
    return int(json.loads(_shared_node("rabbitmq-diagnostics", "status", "--formatter", "json"))["uptime"])


def _shared_queue_names() -> set[str]:
    return set(_shared_node("rabbitmqctl", "list_queues", "name", "--quiet", "--no-table-headers").split())


@pytest.fixture
def shared_node_watched() -> Iterator[None]:
    """The machine's node before and after the test: it kept running (its uptime grew: never
    restarted) and kept its queues (a marker queue still holds its one message: never reset).
    Its whole queue list is not compared: the gate's other shard, running beside this one,
    declares and deletes queues of its own there meanwhile."""
    if not (RABBITMQ_BIN_DIR / "rabbitmq-server").exists():
        tool_missing("Debian's rabbitmq-server is not installed")
    try:
        uptime_before_s = _shared_uptime_s()
    except (OSError, subprocess.SubprocessError) as exc:
        tool_missing(f"the machine's node {SHARED_NODE} cannot be asked ({exc})")
    marker = f"cluster_isolation_{uuid.uuid4().hex[:8]}"
    with pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL)) as connection:
        channel = connection.channel()
        channel.queue_declare(marker, durable=True)
        channel.basic_publish("", marker, b"still here")
    try:
        yield
        with pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL)) as connection:
            kept = connection.channel().queue_declare(marker, passive=True).method.message_count
        assert kept == 1, f"the marker queue on {SHARED_NODE} lost its message: was the node reset?"
        assert _shared_uptime_s() > uptime_before_s, f"{SHARED_NODE} was restarted"
    finally:
        with pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL)) as connection:
            connection.channel().queue_delete(marker)


def _connect(url: str) -> pika.BlockingConnection:
    parameters = pika.URLParameters(url)
    parameters.connection_attempts = 3
    parameters.retry_delay = 1
    parameters.socket_timeout = 5
    return pika.BlockingConnection(parameters)


def _publish_confirmed(url: str, queue: str, count: int) -> None:
    with _connect(url) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for seq in range(count):
            # Confirmed: basic_publish returns once a majority of the queue's members has it
            # (raises on a nack or an unroutable message).
            channel.basic_publish("", queue, str(seq).encode(), mandatory=True,
                                  properties=pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent))


def _consume_all(url: str, queue: str, expected: int, timeout_s: float) -> list[int]:
    received: list[int] = []
    with _connect(url) as connection:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=expected)
        deadline = time.monotonic() + timeout_s
        for method, _properties, body in channel.consume(queue, inactivity_timeout=1):
            if method is not None:
                received.append(int(body))
                channel.basic_ack(method.delivery_tag)
            if len(received) >= expected or time.monotonic() > deadline:
                break
        channel.cancel()
    return received


def _cluster_processes(cluster_dir: Path, node_names: list[str]) -> list[str]:
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "environ"]):
        try:
            cmdline = " ".join(process.info["cmdline"] or ())
            home = (process.info["environ"] or {}).get("HOME")
        except psutil.Error:
            continue
        if str(cluster_dir) in cmdline or home == str(cluster_dir) or any(name in cmdline for name in node_names):
            found.append(f"{process.info['pid']}: {cmdline[:200]}")
    return found


def test_a_quorum_queue_keeps_every_confirmed_message_when_its_leader_node_stops_and_the_node_rejoins(
        cluster: ThrowawayRabbitCluster, shared_node_watched: None) -> None:
    assert len(cluster.running_nodes(0)) == 3
    queue = f"cluster_test_{uuid.uuid4().hex[:8]}"
    with _connect(cluster.urls[0]) as connection:
        connection.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    _publish_confirmed(cluster.urls[1], queue, MESSAGES)

    leader = cluster.leader_of(queue)
    stopping = time.monotonic()
    cluster.stop_node(leader)
    stopped_s = time.monotonic() - stopping
    assert not cluster.running(leader)
    survivor = next(index for index in range(3) if index != leader)
    assert len(cluster.running_nodes(survivor)) == 2

    # The two members left elect a new leader among themselves, and have every message.
    deadline = time.monotonic() + 30
    while True:
        try:
            if cluster.leader_of(queue) != leader:
                break
        except (LookupError, RuntimeError):
            pass
        assert time.monotonic() < deadline, f"no new leader for {queue} after node {leader} stopped"
        time.sleep(0.5)
    assert sorted(_consume_all(cluster.urls[survivor], queue, MESSAGES, timeout_s=30)) == list(range(MESSAGES))

    restarting = time.monotonic()
    cluster.start_node(leader)
    cluster.wait_running(3, timeout_s=60)
    restarted_s = time.monotonic() - restarting
    assert cluster.running_nodes(leader) == sorted(cluster.node_names)
    assert queue not in _shared_queue_names(), f"the cluster's queue is on {SHARED_NODE}"
    print(f"\nleader node stopped in {stopped_s:.1f} s, started and rejoined in {restarted_s:.1f} s")


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayRabbitCluster]:
    """One cluster for the module (a start costs 15 s); each test leaves its three nodes running.
    After close, none of its processes and not its directory may be left."""
    if not (RABBITMQ_BIN_DIR / "rabbitmq-server").exists():
        tool_missing("Debian's rabbitmq-server is not installed")
    began = time.monotonic()
    with throwaway_rabbit_cluster(3) as started:
        print(f"\ncluster of 3 started in {time.monotonic() - began:.1f} s")
        cluster_dir, node_names = started.directory, list(started.node_names)
        yield started
    assert _cluster_processes(cluster_dir, node_names) == []
    assert not cluster_dir.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nudge_only", "shared_node_watched")
@pytest.mark.parametrize("jobs", [pytest.param(1_000, id="gate"),
                                  pytest.param(5_000, id="soak", marks=pytest.mark.soak)])
def test_idempotent_jobs_run_once_each_while_their_queue_leader_s_node_stops_and_starts_again(
        cluster: ThrowawayRabbitCluster, worker_processes: Any, jobs: int) -> None:
    from django.db import transaction
    from django.db.models import Count

    from composition.jobs.models import DeadLetter, ProcessedMessage
    from composition.outbox import OutboxMessage, publish_many
    from composition.testing import wait_until
    from tests.jobsapp.jobs import QUORUM_QUEUE
    from tests.jobsapp.models import Effect

    run = uuid.uuid4().hex[:6]
    keys = [f"{run}-{index}" for index in range(jobs)]
    worker = worker_processes.spawn(
        ["--threads", "4", "--queues", f"{QUORUM_QUEUE},composition.outbox"],
        BROKER_URL=";".join(cluster.urls), COMPOSITION_TEST_OVERRIDES=json.dumps({"RABBITMQ_QUEUE_TYPE": "quorum"}))

    def log() -> str:
        return worker.output()[-3000:]

    # The worker declares its queues as it starts; the leader is found before the jobs flow, so
    # its node stops while they do.
    leaders: list[int] = []

    def leader_found() -> bool:
        try:
            leaders.append(cluster.leader_of(QUORUM_QUEUE))
        except (LookupError, RuntimeError):
            return False
        return True

    wait_until(leader_found, 90, interval_s=0.5, message=f"the worker declared no quorum queue:\n{log()}")
    leader = leaders[-1]
    for start in range(0, jobs, 100):
        with transaction.atomic():
            publish_many("quorum_effect", [{"key": key} for key in keys[start:start + 100]])

    def effects() -> int:
        return Effect.objects.filter(key__startswith=run).count()

    wait_until(lambda: effects() >= jobs // 5, 120, message=f"no jobs ran on the cluster:\n{log()}")
    stopped_at = effects()
    cluster.stop_node(leader)
    wait_until(lambda: effects() >= min(jobs, stopped_at + jobs // 5), 120,
               message=f"no progress with node {leader} stopped:\n{log()}")
    cluster.start_node(leader)
    cluster.wait_running(3, timeout_s=90)
    wait_until(lambda: Effect.objects.filter(key__startswith=run).values("key").distinct().count() == jobs, 180,
               interval_s=0.5, message=f"jobs missing:\n{log()}")
    assert worker.terminate(30) == 0, log()
    doubled = list(Effect.objects.filter(key__startswith=run).values("key").annotate(n=Count("id")).filter(n__gt=1))
    assert doubled == [], "an effect applied twice"
    assert ProcessedMessage.objects.filter(actor="quorum_effect").count() == jobs
    assert not DeadLetter.objects.filter(actor="quorum_effect").exists()
    assert not OutboxMessage.objects.filter(status="pending").exists()
    assert stopped_at < jobs, "every job had run before the node stopped"
    print(f"\n{jobs} jobs on quorum queues: node {leader} (the leader) stopped after {stopped_at} effects, "
          f"every job ran once")


def test_on_the_cluster_a_paused_queue_s_hand_backs_never_use_up_the_delivery_limit(
        cluster: ThrowawayRabbitCluster) -> None:
    from dramatiq.common import xq_name
    from dramatiq.message import Message

    from composition.broker.configured import build_broker
    from composition.broker.pausing import hand_back

    queue = f"cluster_hand_back_{uuid.uuid4().hex[:8]}"
    broker = build_broker(";".join(cluster.urls), heartbeat_timeout_s=5.0, maintenance_chance=0, middleware=[],
                          queue_type="quorum", delivery_limit=1)
    try:
        sent = broker.enqueue(Message(queue_name=queue, actor_name="noop", args=(), kwargs={}, options={}))
        consumer = broker.consume(queue, prefetch=1, timeout=200)
        try:
            for _ in range(4):  # more than the limit of 1
                message = next_message(consumer)
                assert message.message_id == sent.message_id
                hand_back(message)
                consumer.ack(message)
            assert next_message(consumer).message_id == sent.message_id, "dropped past the delivery limit"
        finally:
            consumer.close()
        with _connect(cluster.urls[0]) as connection:
            assert connection.channel().queue_declare(xq_name(queue), passive=True).method.message_count == 0
    finally:
        broker.close()
