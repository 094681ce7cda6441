"""A Redis that stops answering for a while (frozen, not refusing) costs a worker nothing it
does not get back (``composition.broker.redis``): a real Dramatiq worker's consumer threads live
on, and a delayed message they had fetched runs once when due. Before, the freeze's timeout
ended the delay queue's consumer thread for good, and the delayed message, fetched into that
thread's memory and unacknowledged in Redis, waited for the worker's restart. Against a private
Valkey server that the test freezes, never the shared one."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.common import dq_name

from composition.broker.configured import build_broker
from composition.testing import ThrowawayRedis, wait_until

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
