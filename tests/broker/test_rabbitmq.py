"""The RabbitMQ broker (BROKER_URL=amqp://...): readiness, outbox -> relay -> worker -> effect, and the
relay's confirmed, batched publishing (a row is marked sent only once RabbitMQ confirmed it)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import dramatiq
import pika
import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings
from dramatiq.actor import Actor
from dramatiq.broker import MessageProxy
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.common import dq_name, xq_name
from dramatiq.errors import ConnectionClosed
from dramatiq.message import Message

from composition.backpressure.depth import broker_counts, queue_depth
from composition.health import checks as health
from composition.outbox import OutboxMessage, publish
from composition.outbox.enqueue import enqueue_many
from composition.outbox.rabbitmq import ConfirmTimeout, MessagesRejected
from composition.outbox.relay import Relay
from composition.testing import free_port, use_broker, wait_until
from tests.helpers import RABBITMQ_URL
from tests.jobsapp.jobs import RABBIT_QUEUE
from tests.jobsapp.models import Effect

# nudge_only: sent on commit, publish() inserts a row leased to this process's relay for the
# configured (Redis) broker, and these tests relay their rows through a RabbitMQ relay themselves.
pytestmark = [pytest.mark.rabbitmq, pytest.mark.usefixtures("nudge_only")]



@pytest.mark.django_db
def test_readiness_probes_rabbitmq_up_and_down() -> None:
    health.reset_readiness_cache()
    with override_settings(COMPOSITION={**settings.COMPOSITION, "BROKER_URL": RABBITMQ_URL}):
        report = health.readiness(use_cache=False, role="worker")
        assert report.ok, report.as_dict()
    closed = f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F"
    with override_settings(COMPOSITION={**settings.COMPOSITION, "BROKER_URL": closed}):
        report = health.readiness(use_cache=False, role="worker")
    assert not report.ok
    assert [check.name for check in report.checks if not check.ok] == ["broker"]
    health.reset_readiness_cache()


# The worker relays over RabbitMQ; this process's broker is Redis, so it must not send the rows
# itself after commit: it only nudges, and the worker's sweep relays.
@pytest.mark.usefixtures("nudge_only")
@pytest.mark.django_db(transaction=True)
def test_outbox_messages_run_once_through_a_rabbitmq_broker(worker_processes) -> None:  # type: ignore[no-untyped-def]
    run = uuid.uuid4().hex[:8]
    worker = worker_processes.spawn(
        ["--threads", "2", "--queues", f"{RABBIT_QUEUE},composition.outbox", "--shutdown-timeout", "10"],
        BROKER_URL=RABBITMQ_URL)
    keys = [f"{run}-{index}" for index in range(30)]
    with transaction.atomic():
        for key in keys:
            publish("rabbit_effect", {"key": key})
    wait_until(lambda: Effect.objects.filter(key__startswith=run).count() == len(keys), 60,
               message="effects missing:\n" + worker.output()[-3000:])
    assert worker.terminate(20) == 0, worker.output()[-3000:]
    assert sorted(Effect.objects.filter(key__startswith=run).values_list("key", flat=True)) == sorted(keys)


@pytest.mark.slow
@pytest.mark.usefixtures("nudge_only")
@pytest.mark.django_db(transaction=True)
def test_time_limits_are_enforced_under_a_rabbitmq_broker(worker_processes) -> None:  # type: ignore[no-untyped-def]
    from composition.jobs.models import DeadLetter
    from tests.jobsapp.jobs import TIME_LIMIT_QUEUE
    from tests.jobsapp.models import Attempt

    key = f"rabbit-overrun-{uuid.uuid4().hex[:8]}"
    worker = worker_processes.spawn(
        ["--threads", "2", "--queues", f"{TIME_LIMIT_QUEUE},composition.outbox", "--shutdown-timeout", "10"],
        BROKER_URL=RABBITMQ_URL)
    publish("overruns", {"key": key, "run_s": 10})
    wait_until(lambda: DeadLetter.objects.filter(actor="overruns", payload__key=key).exists(), 40,
               message="no dead letter:\n" + worker.output()[-3000:])
    assert DeadLetter.objects.get(payload__key=key).error_class.endswith("TimeLimitExceeded")
    assert list(Attempt.objects.filter(key=key).values_list("attempt", flat=True).order_by("attempt")) == [1, 2]
    assert not Effect.objects.filter(key=key).exists()
    assert worker.terminate(20) == 0, worker.output()[-3000:]


@pytest.mark.slow
@pytest.mark.usefixtures("nudge_only")
@pytest.mark.django_db(transaction=True)
def test_jobs_finished_during_a_drain_longer_than_the_heartbeat_are_acknowledged_once(  # type: ignore[no-untyped-def]
        worker_processes) -> None:
    # The drain stopped the consumer threads, so their connections did no I/O: no heartbeats, and
    # the acknowledgements of jobs finished meanwhile waited in them. RabbitMQ closed them for
    # missed heartbeats and delivered those jobs again, to run a second time.
    from tests.jobsapp.jobs import SLOW_QUEUE
    from tests.jobsapp.models import Attempt

    run = uuid.uuid4().hex[:8]
    keys = [f"{run}-{index}" for index in range(2)]
    worker = worker_processes.spawn(
        ["--threads", "2", "--queues", f"{SLOW_QUEUE},composition.outbox", "--shutdown-timeout", "30"],
        BROKER_URL=f"{RABBITMQ_URL}?heartbeat=2")
    with transaction.atomic():
        for key in keys:
            publish("slow", {"key": key, "hold_s": 9})
    wait_until(lambda: Attempt.objects.filter(key__in=keys).count() == 2, 60, message=worker.output()[-3000:])
    assert worker.terminate(40) == 0, worker.output()[-3000:]  # drains ~9 s: several heartbeat periods
    assert Effect.objects.filter(key__in=keys).count() == 2
    with use_broker(RABBITMQ_URL) as broker:
        assert broker_counts(SLOW_QUEUE, broker).ready == 0, "a job finished in the drain went back to its queue"


# -- the relay over RabbitMQ: confirmed, batched -------------------------------------------------
# Queues get a unique name per run and are deleted (with their delay and dead-letter queues) at
# the end; the outbox rows live in the test's transaction.


@pytest.fixture
def rabbit_broker() -> Iterator[RabbitmqBroker]:
    """A RabbitMQ broker built by ``build_broker``, installed as the configured broker."""
    with use_broker(RABBITMQ_URL) as broker:
        yield broker


@pytest.fixture
def amqp() -> Iterator[Any]:
    """A plain pika channel, for setting queues up and reading messages back."""
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        yield connection.channel()
    finally:
        connection.close()


@pytest.fixture
def new_queue() -> Iterator[Callable[[str], str]]:
    """``new_queue(prefix)``: a queue name unique to this run, deleted at the end."""
    names: list[str] = []

    def new(prefix: str) -> str:
        names.append(f"{prefix}_{uuid.uuid4().hex[:8]}")
        return names[-1]

    yield new
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        channel = connection.channel()
        for name in names:
            for queue in (name, dq_name(name), xq_name(name)):
                channel.queue_delete(queue)
    finally:
        connection.close()


def _probe(seq: int) -> None:
    """Never consumed: these tests read the queue back themselves."""


def _declare_probe(broker: RabbitmqBroker, queue: str) -> Actor[[int], None]:
    return dramatiq.actor(_probe, actor_name=f"probe_{queue}", queue_name=queue, broker=broker)


def _drain(channel: Any, queue: str) -> list[tuple[Any, Message[Any]]]:
    """Every message on ``queue`` as (properties, decoded message), in queue order."""
    drained = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return drained
        drained.append((properties, Message.decode(body)))


def _bounded_queue(broker: RabbitmqBroker, channel: Any, queue: str) -> None:
    """Make ``queue`` hold one message and nack the next (``x-overflow: reject-publish``), and
    fill it. RabbitMQ refuses to declare a queue again with other arguments, so the broker is
    told the queue is declared already instead of declaring it the Dramatiq way."""
    channel.queue_declare(queue, durable=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    broker.declare_queue(queue)
    broker.queues_pending.discard(queue)
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"filler", pika.BasicProperties(delivery_mode=2))


@pytest.mark.django_db
def test_a_row_is_marked_sent_only_after_rabbitmq_confirmed_its_message(  # type: ignore[no-untyped-def]
        rabbit_broker, amqp, new_queue) -> None:
    queue = new_queue("h6_bounded")
    probe = _declare_probe(rabbit_broker, queue)
    _bounded_queue(rabbit_broker, amqp, queue)
    row = publish(probe, {"seq": 1})
    relay = Relay(rabbit_broker)

    with pytest.raises(MessagesRejected, match="1 nacked"):
        relay.run_once()
    row.refresh_from_db()
    assert (row.status, row.claimed_until) == ("pending", None)
    assert row.last_error.startswith("MessagesRejected: RabbitMQ refused 1 of 1 messages")

    assert amqp.basic_get(queue, auto_ack=True)[2] == b"filler"  # drain the queue
    assert relay.run_once() == 1
    row.refresh_from_db()
    assert (row.status, row.last_error) == ("sent", "")
    [(_, message)] = _drain(amqp, queue)
    assert (message.message_id, message.kwargs) == (row.message_id, {"seq": 1})


@pytest.mark.django_db
def test_a_plain_send_to_a_full_queue_raises(rabbit_broker, amqp, new_queue) -> None:  # type: ignore[no-untyped-def]
    # Dramatiq's own enqueue waits for the confirm too (confirm_delivery=True): retries, then raises.
    queue = new_queue("h6_bounded_send")
    probe = _declare_probe(rabbit_broker, queue)
    _bounded_queue(rabbit_broker, amqp, queue)
    with pytest.raises(ConnectionClosed, match="NACKed"):
        probe.send(1)


@pytest.mark.django_db
def test_a_relayed_batch_arrives_complete_in_order_and_in_dramatiqs_format(  # type: ignore[no-untyped-def]
        rabbit_broker, amqp, new_queue) -> None:
    queue = new_queue("h6_batch")  # never declared: the relay declares it, as enqueue would
    probe = _declare_probe(rabbit_broker, queue)
    rows = [publish(probe, {"seq": seq}) for seq in range(200)]
    later = publish(probe, {"seq": -1}, delay_s=60)

    assert Relay(rabbit_broker, batch_size=500).run_once() == 201
    assert set(OutboxMessage.objects.filter(queue_name=queue).values_list("status", flat=True)) == {"sent"}
    drained = _drain(amqp, queue)
    assert [message.kwargs["seq"] for _, message in drained] == list(range(200))
    assert [message.message_id for _, message in drained] == [row.message_id for row in rows]
    assert {(properties.delivery_mode, message.actor_name, message.queue_name)
            for properties, message in drained} == {(2, probe.actor_name, queue)}
    [(_, delayed)] = _drain(amqp, dq_name(queue))
    assert (delayed.message_id, delayed.queue_name) == (later.message_id, dq_name(queue))
    assert abs(delayed.options["eta"] - (later.created_at.timestamp() + 60) * 1000) < 5000
    # Dramatiq's consumer finds all three of its queues.
    assert rabbit_broker.get_queue_message_counts(queue) == (0, 0, 0)


@pytest.mark.django_db
def test_a_returned_message_fails_its_batch_and_its_queue_is_declared_again(  # type: ignore[no-untyped-def]
        rabbit_broker, amqp, new_queue) -> None:
    queue = new_queue("h6_deleted")
    probe = _declare_probe(rabbit_broker, queue)
    relay = Relay(rabbit_broker)
    publish(probe, {"seq": 0})
    assert relay.run_once() == 1
    amqp.queue_delete(queue)  # by hand, under the broker's feet: the next publish is unroutable

    row = publish(probe, {"seq": 1})
    with pytest.raises(MessagesRejected, match="returned unroutable"):
        relay.run_once()
    row.refresh_from_db()
    assert row.status == "pending" and "returned unroutable" in row.last_error
    assert relay.run_once() == 1
    assert [message.kwargs for _, message in _drain(amqp, queue)] == [{"seq": 1}]


def test_threads_publish_batches_on_channels_of_their_own(rabbit_broker, amqp, new_queue) -> None:  # type: ignore[no-untyped-def]
    queue = new_queue("h6_threads")
    errors: list[BaseException] = []

    def send(thread: int) -> None:
        try:
            for batch in range(5):
                enqueue_many(rabbit_broker, [
                    (Message(queue_name=queue, actor_name="probe", args=(), kwargs={"thread": thread, "seq": seq},
                             options={}), None)
                    for seq in range(batch * 50, batch * 50 + 50)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(thread,)) for thread in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    seen: dict[int, list[int]] = {thread: [] for thread in range(4)}
    for _, message in _drain(amqp, queue):
        seen[message.kwargs["thread"]].append(message.kwargs["seq"])
    assert seen == {thread: list(range(250)) for thread in range(4)}


class _MutableProxy:
    """A TCP proxy to RabbitMQ that, while ``muted``, passes what the client sends and drops what
    RabbitMQ answers: a broker that takes messages and never confirms them."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.muted = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        while True:
            try:
                data = source.recv(65536)
                if not data:
                    return
                if not (answers and self.muted.is_set()):
                    sink.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()


@pytest.mark.django_db
def test_a_batch_rabbitmq_does_not_confirm_in_time_is_released(amqp, new_queue) -> None:  # type: ignore[no-untyped-def]
    url = urlsplit(RABBITMQ_URL)
    proxy = _MutableProxy((url.hostname or "127.0.0.1", url.port or 5672))
    userinfo = url.netloc.rpartition("@")[0]
    via_proxy = url._replace(netloc=f"{userinfo}@127.0.0.1:{proxy.port}" if userinfo else f"127.0.0.1:{proxy.port}")
    queue = new_queue("h6_unconfirmed")
    try:
        with override_settings(COMPOSITION={**settings.COMPOSITION, "BROKER_SOCKET_TIMEOUT_S": 0.5}), \
                use_broker(via_proxy.geturl()) as broker:
            probe = _declare_probe(broker, queue)
            relay = Relay(broker)
            publish(probe, {"seq": 0})
            assert relay.run_once() == 1  # connection, channels and queues set up

            row = publish(probe, {"seq": 1})
            proxy.muted.set()
            try:
                began = time.monotonic()
                with pytest.raises(ConfirmTimeout, match=r"confirmed 0 of 1 messages within 0\.5 s"):
                    relay.run_once()
                assert time.monotonic() - began < 5
            finally:
                proxy.muted.clear()  # the confirms dropped meanwhile are lost for good
            row.refresh_from_db()
            assert row.status == "pending" and row.last_error.startswith("ConfirmTimeout")

            assert relay.run_once() == 1
            row.refresh_from_db()
            assert row.status == "sent"
    finally:
        proxy.close()
    # RabbitMQ took the unconfirmed message too: at least once, never lost.
    assert [message.kwargs["seq"] for _, message in _drain(amqp, queue)] == [0, 1, 1]


@pytest.mark.django_db
def test_the_queue_depth_reads_on_after_a_queue_that_did_not_exist_yet(rabbit_broker, amqp,  # type: ignore[no-untyped-def]
                                                                      new_queue) -> None:
    # Asked before any worker declared the queue, RabbitMQ answers 404 and closes the channel;
    # the next read (backpressure's, the sampler's) must see the messages, not a dead channel.
    queue = new_queue("depth_before_declare")
    assert queue_depth(queue) == 0
    assert broker_counts(queue).ready == 0
    amqp.queue_declare(queue, durable=True)
    for _ in range(5):
        amqp.basic_publish("", queue, b"{}")
    amqp.queue_declare(dq_name(queue), durable=True)
    amqp.basic_publish("", dq_name(queue), b"{}")
    wait_until(lambda: queue_depth(queue) == 6, 5, message="the depth stayed at what a closed channel reads")
    assert broker_counts(queue).ready == 5


@pytest.mark.slow
def test_a_rabbitmq_that_accepts_and_never_answers_costs_the_configured_timeouts_and_loses_no_retry() -> None:
    # pika's own defaults waited 15 s on such a server (a load balancer before a dead node), and
    # its handshake timeout was not among the broker failures: the job's retry was lost.
    from composition.broker.configured import build_broker
    from composition.errors import BROKER_FAILURES
    from composition.jobs.middleware.retries import JobRetries

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # connections complete in the backlog; nothing ever answers
    url = f"amqp://guest:guest@127.0.0.1:{silent.getsockname()[1]}/%2F"
    retries = JobRetries()
    broker = build_broker(url, heartbeat_timeout_s=5.0, maintenance_chance=0, socket_timeout_s=0.3,
                          connect_timeout_s=0.3, middleware=[retries])
    try:
        dramatiq.actor(lambda: None, broker=broker, actor_name="silent_probe", queue_name="silent_probe",
                       max_retries=3)
        began = time.monotonic()
        with pytest.raises(BROKER_FAILURES):
            broker_counts("silent_probe", broker)
        assert time.monotonic() - began < 3, "pika's 15 s, not the configured timeouts"
        message = MessageProxy(Message(queue_name="silent_probe", actor_name="silent_probe", args=(), kwargs={},
                                       options={}))
        retries.after_process_message(broker, message, exception=RuntimeError("the job's own error"))
        assert message.failed, "the retry the broker would not take must fail the message, for its dead letter"
    finally:
        broker.close()
        silent.close()


def _connection_pids() -> set[str]:
    listed = subprocess.run(["rabbitmqctl", "-q", "list_connections", "pid"], capture_output=True, text=True,
                            timeout=60, check=True).stdout
    return {line.strip() for line in listed.splitlines() if line.strip().startswith("<")}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("rabbitmqctl") is None, reason="needs rabbitmqctl to close a connection")
def test_a_depth_read_on_a_connection_rabbitmq_closed_reads_through_a_fresh_one(  # type: ignore[no-untyped-def]
        rabbit_broker, amqp, new_queue) -> None:
    # An idle thread's connection sends no heartbeats and RabbitMQ closes it as a matter of
    # course; the read failed, opened the depth breaker, and backpressure read nothing for 5 s.
    queue = new_queue("depth_reconnect")
    amqp.queue_declare(queue, durable=True)
    for seq in range(3):
        amqp.basic_publish("", queue, str(seq).encode())
    before = _connection_pids()
    assert broker_counts(queue, rabbit_broker).ready == 3  # opens this thread's connection
    [ours] = _connection_pids() - before
    subprocess.run(["rabbitmqctl", "-q", "close_connection", ours, "test: as after missed heartbeats"],
                   capture_output=True, timeout=60, check=True)
    time.sleep(0.5)  # the close is on its way; the idle client reads it with its next call
    assert broker_counts(queue, rabbit_broker).ready == 3
