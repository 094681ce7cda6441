"""Empty a broker's queues, so a test starts with no message an earlier test left."""

from __future__ import annotations

from dramatiq import Broker

__all__ = ["empty_queues"]


def empty_queues(*queue_names: str, broker: Broker | None = None) -> None:
    """Drop every message of the named queues, their delay queues included, from ``broker`` (the
    configured one by default); with no name, of every queue on it. On Redis "every queue" is
    every key under the broker's namespace, the messages a killed worker still held included
    (Dramatiq's ``flush_all`` knows only the queues this process declared)."""
    # Late: composition.testing is imported by settings modules, before the app registry exists.
    from dramatiq.brokers.redis import RedisBroker

    from composition.broker.configured import configured_broker

    broker = broker or configured_broker()
    if queue_names:
        for name in queue_names:
            broker.flush(name)
    elif isinstance(broker, RedisBroker):
        keys = list(broker.client.scan_iter(f"{broker.namespace}:*", count=1000))
        if keys:
            broker.client.delete(*keys)
    else:
        broker.flush_all()
