"""One depth per queue: admission, the sampler's gauge and the operations page count the same
backlog (pending outbox rows plus the broker's ready, delayed and unacked messages)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from dramatiq import Message
from dramatiq.common import dq_name, xq_name
from prometheus_client import REGISTRY

from composition.backpressure.depth import QueueDepths, queue_depth
from composition.broker.configured import configured_broker
from composition.operations import operations_snapshot
from composition.outbox import OutboxMessage
from composition.sampling import MetricsSamplerComponent
from composition.testing import use_broker

pytestmark = pytest.mark.django_db

RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


def _message(queue: str) -> Message[Any]:
    return Message(queue_name=queue, actor_name="depth_probe", args=(), kwargs={}, options={})


def _backlog(broker: Any, queue: str, *, ready: int, delayed: int, pending: int) -> None:
    broker.declare_queue(queue)
    for _ in range(ready):
        broker.enqueue(_message(queue))
    for _ in range(delayed):
        broker.enqueue(_message(queue), delay=600_000)
    OutboxMessage.objects.bulk_create(
        [OutboxMessage(actor_name="depth_probe", queue_name=queue, payload={}) for _ in range(pending)])


def _every_count(broker: Any, queue: str) -> dict[str, float | None]:
    sampler = MetricsSamplerComponent(broker, connection_budget=1)
    sampler.sample()  # one pass, as runworkers' sampler makes every interval
    [row] = [row for row in operations_snapshot().queues if row.name == queue]
    return {"now": queue_depth(queue), "admission": QueueDepths().get(queue, max_age_s=0),
            "gauge": REGISTRY.get_sample_value("composition_queue_depth_messages", {"queue": queue}),
            "operations page": row.depth}


@pytest.fixture
def queue() -> Iterator[str]:
    name = f"depth_{uuid.uuid4().hex[:8]}"
    yield name
    configured_broker().flush(name)


def test_on_redis_ready_delayed_and_unacked_messages_count_the_same_everywhere(queue: str) -> None:
    broker = configured_broker()
    _backlog(broker, queue, ready=3, delayed=2, pending=4)
    consumer = broker.consume(queue, prefetch=1, timeout=1000)
    taken = next(message for message in consumer if message is not None)  # fetched, never acked
    try:
        assert _every_count(broker, queue) == dict.fromkeys(
            ("now", "admission", "gauge", "operations page"), 4 + 3 + 2)
    finally:
        consumer.nack(taken)
        consumer.close()


@pytest.mark.rabbitmq
def test_on_rabbitmq_with_no_consumer_running_the_counts_agree(queue: str) -> None:
    with use_broker(RABBITMQ_URL) as broker:
        try:
            _backlog(broker, queue, ready=3, delayed=2, pending=4)
            assert _every_count(broker, queue) == dict.fromkeys(
                ("now", "admission", "gauge", "operations page"), 4 + 3 + 2)
        finally:
            for name in (queue, dq_name(queue), xq_name(queue)):
                broker.channel.queue_delete(name)
