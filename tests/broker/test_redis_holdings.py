"""A fetch whose answer never reached its consumer leaves nothing stranded
(``composition.broker.redis_holdings``): what it moved into the worker's unacknowledged set goes
back to the queue with the queue's next consumer, and a fetch that arrives at Redis after that
(sent before, held up on the way) takes nothing. Through a fault proxy that delays the
consumer's connection, to a private Valkey server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from dramatiq.errors import ConnectionClosed
from dramatiq.message import Message

from composition.broker.configured import build_broker
from composition.broker.keys import acks_key, queue_key
from composition.broker.redis import WakingRedisBroker
from composition.testing import FaultProxy, ThrowawayRedis, fault_proxy

QUEUE = "fenced_probe"
SOCKET_TIMEOUT_S = 0.4
# Longer than the socket timeout: the consumer gives up on its fetch before Redis runs it.
HELD_UP_S = 1.5


@pytest.fixture
def proxy(throwaway_redis_server: ThrowawayRedis) -> Iterator[FaultProxy]:
    with fault_proxy("127.0.0.1", throwaway_redis_server.port) as proxy:
        yield proxy


@pytest.fixture
def brokers(throwaway_redis_server: ThrowawayRedis, proxy: FaultProxy) -> Iterator[tuple[WakingRedisBroker, Any]]:
    """The worker's broker, through the proxy, and a plain client to the server."""
    worker = build_broker(proxy.proxied_url(throwaway_redis_server.url), heartbeat_timeout_s=30.0,
                          maintenance_chance=0, socket_timeout_s=SOCKET_TIMEOUT_S,
                          connect_timeout_s=SOCKET_TIMEOUT_S, middleware=[])
    direct = build_broker(throwaway_redis_server.url, heartbeat_timeout_s=30.0, maintenance_chance=0, middleware=[])
    assert isinstance(worker, WakingRedisBroker)
    yield worker, direct
    worker.client.close()
    direct.client.close()  # type: ignore[attr-defined]


def _send(broker: Any) -> str:
    message = broker.enqueue(Message(queue_name=QUEUE, actor_name="fenced_probe", args=(), kwargs={}, options={}))
    return str(message.options["redis_message_id"])


def _fetch_held_up(worker: WakingRedisBroker, proxy: FaultProxy) -> None:
    """A consumer's fetch that leaves now, reaches Redis ``HELD_UP_S`` later and whose answer
    never arrives: the consumer has lost its connection by then."""
    consumer = worker.consume(QUEUE, prefetch=1, timeout=100)
    worker.client.ping()  # connected first: the fetch, not the connection's set-up, is held up
    proxy.delay(HELD_UP_S)
    try:
        with pytest.raises(ConnectionClosed):
            next(consumer)
    finally:
        proxy.pass_through()  # new connections pass; the held-up fetch still arrives late
        consumer.close()


def _next_message_id(worker: WakingRedisBroker) -> str | None:
    consumer = worker.consume(QUEUE, prefetch=1, timeout=100)
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if (message := next(consumer)) is not None:
                consumer.ack(message)
                return str(message.options["redis_message_id"])
        return None
    finally:
        consumer.close()


def test_a_message_a_lost_fetch_took_goes_back_with_the_queue_s_next_consumer(
        brokers: tuple[WakingRedisBroker, Any], proxy: FaultProxy) -> None:
    worker, direct = brokers
    sent = _send(direct)
    _fetch_held_up(worker, proxy)
    time.sleep(HELD_UP_S + 0.5)  # the fetch ran: the message sits in the worker's unacknowledged set
    unacked = acks_key(worker.namespace, worker.broker_id, QUEUE)
    assert direct.client.smembers(unacked) == {sent.encode()}

    assert _next_message_id(worker) == sent
    assert direct.client.scard(unacked) == 0


def test_a_fetch_that_reaches_redis_after_the_next_consumer_began_takes_nothing(
        brokers: tuple[WakingRedisBroker, Any], proxy: FaultProxy) -> None:
    worker, direct = brokers
    began = time.monotonic()
    _fetch_held_up(worker, proxy)
    # The next consumer begins (it fences the queue) while the first fetch is still on its way.
    consumer = worker.consume(QUEUE, prefetch=1, timeout=100)
    try:
        assert next(consumer) is None
        assert time.monotonic() - began < HELD_UP_S, "too slow to begin before the held-up fetch arrived"
        sent = _send(direct)  # waiting in the queue when the held-up fetch arrives
        time.sleep(max(0.0, began + HELD_UP_S + 0.5 - time.monotonic()))

        assert direct.client.llen(queue_key(worker.namespace, QUEUE)) == 1, "the late fetch took the message"
        assert direct.client.scard(acks_key(worker.namespace, worker.broker_id, QUEUE)) == 0
    finally:
        consumer.close()
    assert _next_message_id(worker) == sent
