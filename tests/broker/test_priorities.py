"""Message priorities (``composition.broker.priorities``) on both brokers, at the broker: among
the messages waiting in a queue the higher priority is fetched first, equal ones in the order
they were sent, through Dramatiq's own enqueue (a retry, ``actor.send``) and the outbox's batched
one alike; Redis counts the prioritised messages in the queue's depth and a flush empties them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from dramatiq.broker import Broker
from dramatiq.message import Message

from composition.backpressure.depth import broker_counts
from composition.broker.configured import build_broker, configured_broker
from composition.broker.keys import lanes_key
from composition.broker.priorities import PRIORITY_OPTION, rabbitmq_priority
from composition.outbox.enqueue import enqueue_many
from composition.sampling.queues import oldest_ready_age_s
from tests.helpers import RABBITMQ_URL, delete_rabbitmq_queue

# (priority, how it is sent): both ways interleaved, every region (above 0, 0, below 0) twice.
SENDS = [(0, "send"), (5, "many"), (-5, "send"), (100, "many"), (0, "many"), (5, "send"), (-100, "many"),
         (1, "send"), (-5, "many"), (100, "send")]


def _message(queue: str, n: int, priority: int) -> Message[Any]:
    options = {PRIORITY_OPTION: priority} if priority else {}
    return Message(queue_name=queue, actor_name="priority_probe", args=(), kwargs={"n": n}, options=options)


def _send_all(broker: Broker, queue: str, sends: list[tuple[int, str]]) -> None:
    for n, (priority, how) in enumerate(sends):
        message = _message(queue, n, priority)
        if how == "send":
            broker.enqueue(message)
        else:
            enqueue_many(broker, [(message, None)])


def _received(broker: Broker, queue: str, count: int, prefetch: int) -> list[int]:
    consumer = broker.consume(queue, prefetch=prefetch, timeout=100)
    order: list[int] = []
    try:
        for _ in range(count * 10):
            message = next(consumer)
            if message is None:
                continue
            order.append(message.kwargs["n"])
            consumer.ack(message)
            if len(order) == count:
                break
    finally:
        consumer.close()
    return order


def _expected(sends: list[tuple[int, str]], level: Any = lambda priority: priority) -> list[int]:
    # Higher first; equal ones (or, on RabbitMQ, ones in the same level) in sending order.
    return [n for n, _ in sorted(enumerate(sends), key=lambda item: (-level(item[1][0]), item[0]))]


@pytest.fixture
def redis_queue() -> Iterator[str]:
    queue = f"prio_{uuid.uuid4().hex[:8]}"
    configured_broker().declare_queue(queue)
    yield queue
    configured_broker().flush(queue)


def test_redis_fetches_the_highest_priority_first_and_equal_ones_in_order(redis_queue: str) -> None:
    broker = configured_broker()
    _send_all(broker, redis_queue, SENDS)
    counts = broker_counts(redis_queue, broker)
    assert (counts.ready, counts.delayed, counts.in_flight) == (len(SENDS), 0, 0)
    # Fetches of 3: each takes the best of what waits, and the order holds across fetches.
    assert _received(broker, redis_queue, len(SENDS), prefetch=3) == _expected(SENDS)
    assert broker_counts(redis_queue, broker).ready == 0


def test_a_redis_message_sent_while_others_wait_overtakes_those_of_lower_priority(redis_queue: str) -> None:
    broker = configured_broker()
    _send_all(broker, redis_queue, [(0, "many"), (0, "many"), (-1, "send")])
    consumer = broker.consume(redis_queue, prefetch=1, timeout=100)
    try:
        first = next(consumer)
        assert first is not None and first.kwargs["n"] == 0
        consumer.ack(first)
        broker.enqueue(_message(redis_queue, 99, 50))  # arrives late, runs next
        order = []
        while len(order) < 3:
            message = next(consumer)
            if message is not None:
                order.append(message.kwargs["n"])
                consumer.ack(message)
    finally:
        consumer.close()
    assert order == [99, 1, 2]


def test_a_redis_flush_empties_the_priority_lanes(redis_queue: str) -> None:
    broker = configured_broker()
    _send_all(broker, redis_queue, SENDS)
    broker.flush(redis_queue)
    assert broker_counts(redis_queue, broker).ready == 0
    assert not broker.client.exists(lanes_key(broker.namespace, redis_queue))  # type: ignore[attr-defined]


def test_rabbitmq_maps_priorities_onto_its_levels() -> None:
    assert rabbitmq_priority({}, None) is None and rabbitmq_priority({PRIORITY_OPTION: 100}, None) is None
    levels = [rabbitmq_priority({PRIORITY_OPTION: priority}, 10) for priority in (-100, -50, 0, 1, 50, 100)]
    assert levels == [0, 2, 5, 5, 8, 10]  # monotonic; 0 and 1 share a level
    assert rabbitmq_priority({}, 10) == 5  # a message without a priority is a 0


@pytest.mark.rabbitmq
def test_rabbitmq_delivers_the_highest_level_first_and_equal_ones_in_order() -> None:
    queue = f"prio_{uuid.uuid4().hex[:8]}"
    broker = build_broker(RABBITMQ_URL, heartbeat_timeout_s=10.0, maintenance_chance=0, middleware=[],
                          max_priority=10)
    try:
        broker.declare_queue(queue, ensure=True)  # type: ignore[call-arg]
        _send_all(broker, queue, SENDS)
        expected = _expected(SENDS, lambda priority: rabbitmq_priority({PRIORITY_OPTION: priority}, 10))
        assert _received(broker, queue, len(SENDS), prefetch=1) == expected
    finally:
        broker.close()
        delete_rabbitmq_queue(queue)


def test_the_oldest_message_s_age_counts_the_priority_lanes(redis_queue: str) -> None:
    # The age read the list's head only: a backlog of prioritised messages read 0 s old.
    broker = configured_broker()
    now_s = time.time()
    for age_s, priority in ((30, 0), (300, -5), (120, 50)):
        message = _message(redis_queue, age_s, priority)
        broker.enqueue(message.copy(message_timestamp=int((now_s - age_s) * 1000)))
    assert oldest_ready_age_s(broker, redis_queue, now_s=now_s) == pytest.approx(300, abs=1)
    _received(broker, redis_queue, 1, prefetch=1)  # the 50 goes first
    assert oldest_ready_age_s(broker, redis_queue, now_s=now_s) == pytest.approx(300, abs=1)
    _received(broker, redis_queue, 2, prefetch=2)
    assert oldest_ready_age_s(broker, redis_queue, now_s=now_s) == 0.0
