"""ThrowawayRabbitCluster: three real RabbitMQ nodes clustered on this machine, a quorum queue that
keeps every confirmed message when its leader's node stops, and the machine's own node
(``rabbit@localhost``, CI's service) left exactly as it was."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import psutil
import pytest

from composition.testing import ThrowawayRabbitCluster
from composition.testing.rabbitmq_cluster import RABBITMQ_BIN_DIR
from tests.browser import tool_missing
from tests.helpers import RABBITMQ_URL

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
        shared_node_watched: None) -> None:
    began = time.monotonic()
    cluster = ThrowawayRabbitCluster(3)
    cluster_dir, node_names = cluster.directory, list(cluster.node_names)
    try:
        cluster.start()
        started_s = time.monotonic() - began
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
                new_leader = cluster.leader_of(queue)
                if new_leader != leader:
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
        assert cluster.running_nodes(leader) == sorted(node_names)
        assert queue not in _shared_queue_names(), f"the cluster's queue is on {SHARED_NODE}"
    finally:
        closing = time.monotonic()
        cluster.close()
        closed_s = time.monotonic() - closing

    assert _cluster_processes(cluster_dir, node_names) == []
    assert not cluster_dir.exists()
    print(f"\ncluster of 3 started in {started_s:.1f} s; leader node stopped in {stopped_s:.1f} s, "
          f"started and rejoined in {restarted_s:.1f} s; closed in {closed_s:.1f} s; "
          f"{time.monotonic() - began:.1f} s in all")
