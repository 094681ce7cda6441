"""``composition.testing.empty_queues`` against the real test broker."""

from __future__ import annotations

from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import dq_name
from dramatiq.message import Message

from composition.broker.configured import configured_broker
from composition.testing import empty_queues
from tests.helpers import unique


def _put(queue: str) -> None:
    configured_broker().enqueue(Message(queue_name=queue, actor_name="probe", args=(), kwargs={}, options={}))


def _ready(queue: str) -> int:
    broker = configured_broker()
    assert isinstance(broker, RedisBroker)
    return int(broker.client.llen(f"{broker.namespace}:{queue}"))


def test_named_queues_and_their_delay_queues_are_emptied_and_no_other() -> None:
    emptied, kept = unique("q"), unique("q")
    for queue in (emptied, dq_name(emptied), kept):
        _put(queue)
    empty_queues(emptied)
    assert (_ready(emptied), _ready(dq_name(emptied)), _ready(kept)) == (0, 0, 1)
    empty_queues(kept)
    assert _ready(kept) == 0


def test_no_name_empties_every_queue_on_the_broker() -> None:
    queues = [unique("q") for _ in range(3)]
    for queue in queues:
        _put(queue)
    empty_queues()
    assert [_ready(queue) for queue in queues] == [0, 0, 0]
