"""A message a worker puts back on its queue (a drained job, a dead letter the database would not
take) goes back once, as it was fetched (``composition.jobs.middleware.retries.requeue_message``):

- it survives being fetched again by a consumer of the same worker before the original is
  acknowledged. Redis's own requeue moved the same id back from the worker's unacked set: the
  refetch put that id in the set again, the original's acknowledgement then deleted the
  message's body, and the refetched message, handed back unrun by a stopping worker, found
  nothing to put back. Lost;
- it is not doubled when the drain has handed it back already;
- it keeps the retries count it was fetched with (the failed run's bookkeeping raised it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from dramatiq.broker import Consumer, MessageProxy
from dramatiq.common import xq_name
from dramatiq.message import Message

from composition.broker.configured import build_broker
from composition.broker.redis import WakingRedisBroker
from composition.conf import conf
from composition.jobs.middleware.dead_letters import requeue_as_copy
from composition.jobs.middleware.retries import JobRetries, requeue_message
from composition.jobs.runtime import requeue_unacked

QUEUE = "requeue_unit"


@pytest.fixture
def broker() -> Iterator[WakingRedisBroker]:
    # A broker of its own, with the queue declared (the drain hands back declared queues only).
    broker = build_broker(conf.BROKER_URL, heartbeat_timeout_s=60.0, maintenance_chance=0, middleware=[])
    assert isinstance(broker, WakingRedisBroker)
    broker.declare_queue(QUEUE)
    broker.flush(QUEUE)
    yield broker
    broker.flush(QUEUE)
    broker.client.close()


def _fetch(consumer: Consumer) -> MessageProxy:
    """The next message (a wake token can make ``next`` return None first)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        message = next(consumer)
        if message is not None:
            return message
    raise AssertionError("no message within 5 s")


def _sent(broker: WakingRedisBroker) -> Message[Any]:
    return broker.enqueue(Message(queue_name=QUEUE, actor_name="requeue_unit_probe", args=(7,), kwargs={},
                                  options={"retries": 3}))


def test_a_requeued_message_survives_a_refetch_by_the_same_worker(broker: WakingRedisBroker) -> None:
    sent = _sent(broker)
    consumer = broker.consume(QUEUE, prefetch=2, timeout=100)
    try:
        original = _fetch(consumer)
        requeue_message(broker, original)  # a drained job goes back as it was
        refetched = _fetch(consumer)  # this worker's consumer, with room to prefetch, takes it again
        assert refetched.message_id == sent.message_id
        assert refetched.options["retries"] == 3  # no attempt used
        consumer.ack(original)  # the worker thread's acknowledgement of the drained original
        consumer.requeue([refetched])  # the worker stops before running the refetched one
    finally:
        consumer.close()

    again = broker.consume(QUEUE, prefetch=1, timeout=100)
    try:
        survivor = _fetch(again)
        assert (survivor.message_id, survivor.args) == (sent.message_id, (7,))
        again.ack(survivor)
    finally:
        again.close()
    assert broker.do_qsize(QUEUE) == 0


def test_a_message_the_drain_handed_back_already_is_not_doubled(broker: WakingRedisBroker) -> None:
    _sent(broker)
    consumer = broker.consume(QUEUE, prefetch=1, timeout=100)
    try:
        original = _fetch(consumer)
        assert requeue_unacked(broker) == 1  # the drain's deadline: everything unacked goes back
        requeue_message(broker, original)  # the job's Shutdown unwinds only now
        consumer.ack(original)
    finally:
        consumer.close()
    assert broker.do_qsize(QUEUE) == 1


def test_a_message_requeued_for_its_dead_letter_goes_back_as_fetched_and_not_to_the_dlq(
        broker: WakingRedisBroker) -> None:
    # The database would not take the dead letter: the message goes back to fail again later,
    # with the retries count it was fetched with, and no copy sits in the broker's DLQ.
    _sent(broker)
    retries = JobRetries()
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    consumer = broker.consume(QUEUE, prefetch=2, timeout=100)
    try:
        original = _fetch(consumer)
        retries.before_process_message(broker, original)
        # Its last attempt failed: Dramatiq's Retries counted it and failed it.
        original.options["retries"] += 1
        original.options["traceback"] = "Traceback ..."
        original.fail()
        requeue_as_copy(broker, original)
        # What Dramatiq's consumer thread does next.
        (consumer.nack if original.failed else consumer.ack)(original)
        refetched = _fetch(consumer)
        assert (refetched.options["retries"], "traceback" in refetched.options) == (3, False)
        consumer.ack(refetched)
        assert client.zcard(f"{broker.namespace}:{xq_name(QUEUE)}") == 0
        assert broker.do_qsize(QUEUE) == 0
    finally:
        consumer.close()
        client.close()
