"""Giving a dead worker's messages back within seconds (Redis broker).

Dramatiq requeues a dead worker's unacked messages only in its chance "maintenance" step.
``return_dead_workers_messages`` runs that step (Dramatiq's own ``dispatch.lua``) on every queue
this worker consumes; ``BrokerKeepalive`` calls it at start and on every beat, so a crashed
worker's messages come back within ``BROKER_HEARTBEAT_TIMEOUT_S``. A live worker beats every
quarter of that timeout and is never taken for a dead one; hosts' clocks must agree well within it.
"""

from __future__ import annotations

from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis

__all__ = ["return_dead_workers_messages"]

# dispatch.lua's flag for "run the maintenance step in this call"; Dramatiq sets it by chance.
_DO_MAINTENANCE = 1


def return_dead_workers_messages(broker: RedisBroker, *, recover: bool = True) -> None:
    """Move the unacked messages of every worker silent for the broker's ``heartbeat_timeout``
    back to their queues, for each queue (and delay queue) ``broker`` consumes; also records
    this worker's own heartbeat. One small script call per queue. ``recover=False`` only
    records the heartbeat."""
    dispatch = broker.scripts["dispatch"]
    # dispatch.lua's arguments, in the order RedisBroker._dispatch passes them (Dramatiq 2.x).
    for queue_name in sorted(set(broker.get_declared_queues()) | set(broker.delay_queues)):
        dispatch(keys=[broker.namespace], args=[
            "qsize", current_millis(), queue_name, broker.broker_id, broker.heartbeat_timeout,
            broker.dead_message_ttl, _DO_MAINTENANCE if recover else 0, broker._max_unpack_size()])
