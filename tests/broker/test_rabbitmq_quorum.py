"""RabbitMQ quorum queues (``RABBITMQ_QUEUE_TYPE = "quorum"``) on the machine's RabbitMQ: how each
queue is declared, a classic queue of the same name refused with what to do and nothing lost, a
pause's hand-back that never uses the delivery limit up, and jobs through the outbox end to end.
(The 3-node cluster is tests/broker/test_rabbitmq_cluster.py.)"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
from dramatiq.common import dq_name, xq_name
from dramatiq.message import Message

from composition.broker.configured import build_broker
from composition.broker.pausing import hand_back
from composition.broker.rabbitmq_queues import UNLIMITED_DELIVERIES, QueueArgumentsConflict
from tests.helpers import RABBITMQ_URL, delete_rabbitmq_queue, next_message
from tests.jobsapp.jobs import QUORUM_QUEUE
from tests.jobsapp.models import Effect

pytestmark = pytest.mark.rabbitmq


def _broker(queue_type: str, delivery_limit: int = 20) -> Any:
    return build_broker(RABBITMQ_URL, heartbeat_timeout_s=5.0, maintenance_chance=0, middleware=[],
                        queue_type=queue_type, delivery_limit=delivery_limit)


@pytest.fixture
def amqp() -> Iterator[Any]:
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        yield connection
    finally:
        connection.close()


@pytest.fixture
def new_queue() -> Iterator[Callable[[], str]]:
    names: list[str] = []

    def new() -> str:
        names.append(f"quorum_{uuid.uuid4().hex[:8]}")
        return names[-1]

    yield new
    for name in names:
        delete_rabbitmq_queue(name)


def _declares(amqp: Any, name: str, arguments: dict[str, Any]) -> bool:
    """Whether declaring ``name`` with ``arguments`` is equivalent to the queue that exists."""
    channel = amqp.channel()
    try:
        channel.queue_declare(name, durable=True, arguments=arguments)
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 406, exc
        return False
    channel.close()
    return True


def _count(amqp: Any, name: str) -> int:
    channel = amqp.channel()
    try:
        return int(channel.queue_declare(name, passive=True).method.message_count)
    finally:
        channel.close()


def test_the_work_queue_has_the_delivery_limit_and_its_delay_and_dead_queues_are_quorum_too(
        amqp: Any, new_queue: Callable[[], str]) -> None:
    name = new_queue()
    broker = _broker("quorum", delivery_limit=7)
    try:
        broker.declare_queue(name, ensure=True)
    finally:
        broker.close()
    dead_letters = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": xq_name(name)}
    quorum = {"x-queue-type": "quorum"}
    # RabbitMQ compares a declaration's arguments with the queue's: equal or refused.
    assert _declares(amqp, name, {**quorum, **dead_letters, "x-delivery-limit": 7})
    assert not _declares(amqp, name, {**quorum, **dead_letters, "x-delivery-limit": 8})
    assert not _declares(amqp, name, dead_letters)  # a classic queue
    assert _declares(amqp, dq_name(name), {**quorum, **dead_letters, "x-delivery-limit": UNLIMITED_DELIVERIES})
    assert not _declares(amqp, dq_name(name), {**quorum, **dead_letters, "x-delivery-limit": 7})
    assert _declares(amqp, xq_name(name), {**quorum, "x-message-ttl": 86400000 * 7})


def test_a_classic_queue_of_the_same_name_is_refused_with_what_to_do_and_keeps_its_messages(
        amqp: Any, new_queue: Callable[[], str]) -> None:
    name = new_queue()
    classic = _broker("classic")
    quorum = _broker("quorum")
    try:
        classic.declare_queue(name, ensure=True)
        for index in range(3):
            classic.enqueue(Message(queue_name=name, actor_name="noop", args=(), kwargs={"n": index}, options={}))
        with pytest.raises(QueueArgumentsConflict) as refused:
            quorum.enqueue(Message(queue_name=name, actor_name="noop", args=(), kwargs={"n": 3}, options={}))
        assert f"rabbitmqctl delete_queue {name}, {dq_name(name)} and {xq_name(name)}" in str(refused.value)
        assert "inequivalent arg 'x-queue-type'" in str(refused.value)
        # The refusal closed only that channel: the broker declares and sends on a fresh one.
        with pytest.raises(QueueArgumentsConflict):
            quorum.declare_queue(name, ensure=True)
        other = new_queue()
        quorum.enqueue(Message(queue_name=other, actor_name="noop", args=(), kwargs={}, options={}))
    finally:
        classic.close()
        quorum.close()
    assert _count(amqp, name) == 3
    assert _count(amqp, other) == 1


def test_a_paused_queue_s_hand_backs_never_use_up_the_delivery_limit(amqp: Any, new_queue: Callable[[], str]) -> None:
    # A delivery limit of 1: one requeue would send the message to the dead queue.
    name = new_queue()
    broker = _broker("quorum", delivery_limit=1)
    try:
        sent = broker.enqueue(Message(queue_name=name, actor_name="noop", args=(), kwargs={"n": 1}, options={}))
        consumer = broker.consume(name, prefetch=1, timeout=200)
        try:
            for _ in range(5):
                message = next_message(consumer)
                assert message.message_id == sent.message_id
                hand_back(message)
                consumer.ack(message)
            last = next_message(consumer)
            assert last.message_id == sent.message_id and last.kwargs == {"n": 1}
            consumer.ack(last)
            consumer.channel.connection.process_data_events(0.2)  # send the ack
        finally:
            consumer.close()
    finally:
        broker.close()
    assert (_count(amqp, name), _count(amqp, xq_name(name))) == (0, 0)




@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_runworkers_refuses_to_start_on_a_classic_queue_of_the_same_name_saying_what_to_do(
        worker_processes: Any, amqp: Any) -> None:
    # Only the job queue: the relay's queue on the machine's RabbitMQ is the other tests' (classic),
    # and a worker must not declare it quorum. (Jobs run end to end on quorum queues on a private
    # cluster: tests/broker/test_rabbitmq_cluster.py.)
    delete_rabbitmq_queue(QUORUM_QUEUE)
    classic = _broker("classic")
    try:
        classic.declare_queue(QUORUM_QUEUE, ensure=True)
        classic.enqueue(Message(queue_name=QUORUM_QUEUE, actor_name="quorum_effect", args=(),
                                kwargs={"key": "left-on-classic"}, options={}))
    finally:
        classic.close()
    try:
        refused = worker_processes.spawn(["--threads", "2", "--queues", QUORUM_QUEUE], BROKER_URL=RABBITMQ_URL,
                                         COMPOSITION_TEST_OVERRIDES=json.dumps({"RABBITMQ_QUEUE_TYPE": "quorum"}))
        assert refused.process.wait(60) == 1, refused.output()[-3000:]
        assert "QueueArgumentsConflict" in refused.output()
        assert f"rabbitmqctl delete_queue {QUORUM_QUEUE}, {QUORUM_QUEUE}.DQ and {QUORUM_QUEUE}.XQ" in refused.output()
        assert _count(amqp, QUORUM_QUEUE) == 1, "the classic queue lost its message"
        assert not Effect.objects.filter(key="left-on-classic").exists()
    finally:
        delete_rabbitmq_queue(QUORUM_QUEUE)


def test_the_broker_probe_takes_a_cluster_s_node_urls_and_is_up_while_one_answers() -> None:
    from django.conf import settings
    from django.test import override_settings

    from composition.health.probes import probe_broker
    from composition.testing import free_port

    closed = f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F"
    with override_settings(COMPOSITION={**settings.COMPOSITION, "BROKER_URL": f"{closed};{RABBITMQ_URL}"}):
        probe_broker(2.0)
    with override_settings(COMPOSITION={**settings.COMPOSITION, "BROKER_URL": f"{closed};{closed}"}), \
            pytest.raises(pika.exceptions.AMQPConnectionError):
        probe_broker(2.0)
