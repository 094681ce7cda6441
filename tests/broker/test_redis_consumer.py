"""A Redis that stops answering for a while (frozen, not refusing) costs a worker nothing it
does not get back (``composition.broker.redis``): a real Dramatiq worker's consumer threads live
on, and a delayed message they had fetched runs once when due. Before, the freeze's timeout
ended the delay queue's consumer thread for good, and the delayed message, fetched into that
thread's memory and unacknowledged in Redis, waited for the worker's restart. Against a private
Valkey server that the test freezes, never the shared one.

The consumer itself (``WakingRedisConsumer``): an ack or a nack that a frozen Redis never
answers is a lost connection (``ConnectionClosed``, so Dramatiq restarts the consumer); what a
requeue could not hand back goes to the queue's next consumer; a freeze during a wait costs one
idle poll; a full prefetch takes nothing more and leaves the wake token to another consumer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.common import dq_name
from dramatiq.errors import ConnectionClosed
from dramatiq.message import Message
from dramatiq.middleware import Middleware

from composition.broker.configured import build_broker
from composition.broker.keys import acks_key
from composition.broker.redis import WakingRedisBroker
from composition.broker.redis_consumer import wake_key
from composition.testing import ThrowawayRedis, fault_proxy, throwaway_redis, wait_until

QUEUE = "outage_probe"
DELAY_MS = 2500


@pytest.fixture
def worker(throwaway_redis_server: ThrowawayRedis) -> Iterator[tuple[Any, list[str]]]:
    broker = build_broker(throwaway_redis_server.url, heartbeat_timeout_s=30.0, maintenance_chance=0,
                          socket_timeout_s=0.3, connect_timeout_s=0.3, middleware=[])
    runs: list[str] = []
    dramatiq.actor(runs.append, broker=broker, actor_name="outage_probe", queue_name=QUEUE)
    worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=1)
    worker.start()
    yield worker, runs
    worker.stop(timeout=5000)
    broker.client.close()  # type: ignore[attr-defined]


def _consumer_threads(worker: Any) -> dict[str, threading.Thread]:
    return dict(worker.consumers)


def test_a_frozen_redis_neither_ends_consumer_threads_nor_strands_a_delayed_message(
        worker: tuple[Any, list[str]], throwaway_redis_server: ThrowawayRedis) -> None:
    dramatiq_worker, runs = worker
    dramatiq_worker.broker.get_actor("outage_probe").send_with_options(args=("delayed",), delay=DELAY_MS)
    delayed_queue = f"{dramatiq_worker.broker.namespace}:__acks__.{dramatiq_worker.broker.broker_id}.{dq_name(QUEUE)}"
    # Fetched by the delay queue's consumer: unacknowledged in Redis, in the thread's memory.
    wait_until(lambda: dramatiq_worker.broker.client.scard(delayed_queue) == 1, timeout_s=5)
    consumers = _consumer_threads(dramatiq_worker)
    assert set(consumers) == {QUEUE, dq_name(QUEUE)}

    throwaway_redis_server.freeze()
    time.sleep(1.5)  # several fetches time out meanwhile
    throwaway_redis_server.thaw()

    wait_until(lambda: runs == ["delayed"], timeout_s=15,
               message="the delayed message never ran after the freeze")
    time.sleep(1.0)  # and only once
    assert runs == ["delayed"]
    assert all(thread.is_alive() for thread in consumers.values()), "a consumer thread died in the freeze"
    # It goes on consuming: a message sent now runs too.
    dramatiq_worker.broker.get_actor("outage_probe").send("after")
    wait_until(lambda: runs == ["delayed", "after"], timeout_s=10)


# -- the consumer, in this process -----------------------------------------------------------------

SOCKET_TIMEOUT_S = 0.4
IDLE_POLL_MS = 100


@pytest.fixture
def broker(throwaway_redis_server: ThrowawayRedis) -> Iterator[WakingRedisBroker]:
    broker = build_broker(throwaway_redis_server.url, heartbeat_timeout_s=30.0, maintenance_chance=0,
                          socket_timeout_s=SOCKET_TIMEOUT_S, connect_timeout_s=SOCKET_TIMEOUT_S, middleware=[])
    assert isinstance(broker, WakingRedisBroker)
    yield broker
    broker.client.close()


@pytest.fixture
def frozen(throwaway_redis_server: ThrowawayRedis) -> Iterator[Any]:
    """``with frozen():`` freezes the private server for the block, thawed whatever happens."""

    @contextmanager
    def freeze() -> Iterator[None]:
        throwaway_redis_server.freeze()
        try:
            yield
        finally:
            throwaway_redis_server.thaw()

    yield freeze
    throwaway_redis_server.thaw()


def _send(broker: WakingRedisBroker, count: int = 1) -> list[str]:
    messages = [broker.enqueue(Message(queue_name=QUEUE, actor_name="outage_probe", args=(seq,), kwargs={},
                                       options={})) for seq in range(count)]
    return [message.message_id for message in messages]


def _fetched(consumer: Any, count: int) -> list[Any]:
    """The next ``count`` messages the consumer hands out (``next`` returns None after an idle poll)."""
    messages: list[Any] = []
    deadline = time.monotonic() + 5
    while len(messages) < count and time.monotonic() < deadline:
        if (message := next(consumer)) is not None:
            messages.append(message)
    assert len(messages) == count, messages
    return messages


@pytest.mark.slow
@pytest.mark.parametrize("settle", ["ack", "nack"])
def test_an_ack_or_nack_that_redis_does_not_answer_is_a_lost_connection(
        broker: WakingRedisBroker, frozen: Any, settle: str) -> None:
    # Dramatiq's consumer turns a refused connection into ConnectionClosed (the consumer thread
    # restarts), but lets a timeout escape to the worker thread.
    consumer = broker.consume(QUEUE, prefetch=1, timeout=IDLE_POLL_MS)
    try:
        _send(broker)
        [message] = _fetched(consumer, 1)
        with frozen():
            began = time.monotonic()
            with pytest.raises(ConnectionClosed):
                getattr(consumer, settle)(message)
            assert time.monotonic() - began < SOCKET_TIMEOUT_S + 1.0
        getattr(consumer, settle)(message)  # thawed: it goes through
        assert broker.client.scard(acks_key(broker.namespace, broker.broker_id, QUEUE)) == 0
    finally:
        consumer.close()


@pytest.mark.slow
def test_messages_a_failed_requeue_held_go_back_to_the_queue_s_next_consumer() -> None:
    # A stopping worker hands back its prefetched messages and Redis is away (restarting: a
    # frozen one would run the requeue once thawed). They stay unacknowledged under this
    # worker's id, which still beats: only this process can give them back, and its next
    # consumer of the queue does. A server that keeps every write across its restart.
    with throwaway_redis(appendonly=True, appendfsync="always") as server:
        broker = build_broker(server.url, heartbeat_timeout_s=30.0, maintenance_chance=0,
                              socket_timeout_s=SOCKET_TIMEOUT_S, connect_timeout_s=SOCKET_TIMEOUT_S, middleware=[])
        assert isinstance(broker, WakingRedisBroker)
        try:
            sent = _send(broker, 2)
            consumer = broker.consume(QUEUE, prefetch=2, timeout=IDLE_POLL_MS)
            fetched = _fetched(consumer, 2)
            server.stop()
            with pytest.raises(ConnectionClosed):
                consumer.requeue(fetched)
            consumer.close()
            server.start()

            again = broker.consume(QUEUE, prefetch=2, timeout=IDLE_POLL_MS)
            try:
                assert sorted(message.message_id for message in _fetched(again, 2)) == sorted(sent)
            finally:
                again.close()
        finally:
            broker.client.close()


@pytest.mark.slow
def test_a_redis_that_freezes_during_a_wait_costs_one_idle_poll_not_the_connection(
        broker: WakingRedisBroker, throwaway_redis_server: ThrowawayRedis) -> None:
    consumer = broker.consume(QUEUE, prefetch=1, timeout=1000)  # waits SOCKET_TIMEOUT_S / 2 at most
    watcher = redis.Redis.from_url(throwaway_redis_server.url)
    outcome: list[Any] = []

    def consume() -> None:
        try:
            outcome.append(next(consumer))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=consume)
    try:
        thread.start()
        # Freeze once its fetch came back empty and it waits on the wake list.
        wait_until(lambda: any(client["cmd"] == "blpop" for client in watcher.client_list()), 2,
                   interval_s=0.005)
        throwaway_redis_server.freeze()
        thread.join(SOCKET_TIMEOUT_S + 2)
        throwaway_redis_server.thaw()
        assert outcome == [None], "the wait's timeout was taken for a lost connection"
        _send(broker)
        assert len(_fetched(consumer, 1)) == 1
    finally:
        throwaway_redis_server.thaw()
        thread.join(5)
        consumer.close()
        watcher.close()


@pytest.mark.slow
def test_a_consumer_with_a_full_prefetch_takes_nothing_more_and_leaves_the_wake_token(
        broker: WakingRedisBroker) -> None:
    busy = broker.consume(QUEUE, prefetch=2, timeout=IDLE_POLL_MS)
    idle = broker.consume(QUEUE, prefetch=1, timeout=IDLE_POLL_MS)
    queue = f"{broker.namespace}:{QUEUE}"
    try:
        first_ids = _send(broker, 2)
        first, second = _fetched(busy, 2)
        assert [first.message_id, second.message_id] == first_ids
        broker.client.delete(wake_key(broker, QUEUE))
        [third_id] = _send(broker)  # its token: for a consumer that can take it
        assert next(busy) is None, "a consumer with a full prefetch took another message"
        assert broker.client.llen(wake_key(broker, QUEUE)) == 1, "the full consumer used up the wake token"
        assert broker.client.llen(queue) == 1
        assert [message.message_id for message in _fetched(idle, 1)] == [third_id]

        fourth_id, _ = _send(broker, 2)
        busy.ack(first)  # room for one more, not two
        assert [message.message_id for message in _fetched(busy, 1)] == [fourth_id]
        assert broker.client.llen(queue) == 1, "it fetched beyond its prefetch"
    finally:
        busy.close()
        idle.close()


def test_a_delayed_message_whose_move_to_its_queue_lost_the_connection_runs_and_so_do_the_rest(
        throwaway_redis_server: ThrowawayRedis) -> None:
    # Dramatiq's consumer thread moves a due delayed message with broker.enqueue(), outside the
    # consumer's calls: a lost connection there restarted the consumer without marking the queue
    # for recovery, and the message stayed in the live worker's unacknowledged set until it
    # stopped. Cut exactly then: the proxy blackholes as the move's enqueue begins.
    with fault_proxy("127.0.0.1", throwaway_redis_server.port) as proxy:
        broker = build_broker(proxy.proxied_url(throwaway_redis_server.url), heartbeat_timeout_s=30.0,
                              maintenance_chance=0, socket_timeout_s=0.3, connect_timeout_s=0.3, middleware=[])
        runs: list[str] = []
        dramatiq.actor(runs.append, broker=broker, actor_name="outage_probe", queue_name=QUEUE)
        cut: list[threading.Timer] = []

        class CutTheFirstMove(Middleware):
            def before_enqueue(self, broker: Any, message: Any, delay: int) -> None:
                if message.queue_name == QUEUE and message.args == ("first",) and not cut:
                    proxy.blackhole()
                    cut.append(threading.Timer(1.0, proxy.pass_through))
                    cut[0].start()

        broker.add_middleware(CutTheFirstMove())
        actor = broker.get_actor("outage_probe")
        actor.send_with_options(args=("first",), delay=1500)
        for name in ("second", "third"):
            actor.send_with_options(args=(name,), delay=3000)
        worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=1)
        worker.start()
        try:
            wait_until(lambda: sorted(runs) == ["first", "second", "third"], timeout_s=20,
                       message=f"not every delayed message ran: {runs}")
            assert cut, "the move was never cut"
            delayed = acks_key(broker.namespace, broker.broker_id, dq_name(QUEUE))
            wait_until(lambda: broker.client.scard(delayed) == 0, timeout_s=5)
        finally:
            worker.stop(timeout=5000)
            broker.client.close()  # type: ignore[attr-defined]
