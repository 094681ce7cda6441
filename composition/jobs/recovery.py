"""Giving a dead worker's messages back within seconds (Redis broker).

Dramatiq requeues a dead worker's unacked messages only in its chance "maintenance" step.
``return_dead_workers_messages`` runs that step (Dramatiq's own ``dispatch.lua``) on every queue
this worker declares once some worker is dead; ``BrokerKeepalive`` calls it at start and on every
beat, so a crashed worker's messages come back within ``BROKER_HEARTBEAT_TIMEOUT_S``. A live
worker beats every quarter of that timeout and is never taken for a dead one; hosts' clocks must
agree well within it.
"""

from __future__ import annotations

from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis

__all__ = ["return_dead_workers_messages"]

# dispatch.lua's flag for "run the maintenance step in this call"; Dramatiq sets it by chance.
_DO_MAINTENANCE = 1


def return_dead_workers_messages(broker: RedisBroker, *, recover: bool = True) -> None:
    """Record this worker's heartbeat and, once some worker has been silent for the broker's
    ``heartbeat_timeout``, move its unacked messages back to their queues, for each queue (and
    delay queue) ``broker`` declares. Two round trips while no worker is dead (every beat of
    every worker), then one small script call per queue. ``recover=False`` only records the
    heartbeat."""
    queues = sorted(set(broker.get_declared_queues()) | set(broker.delay_queues))
    if not queues:
        return
    now = current_millis()
    _dispatch_qsize(broker, queues[0], now, maintenance=False)  # the heartbeat
    if not recover or not broker.client.zcount(f"{broker.namespace}:__heartbeats__", 0,
                                               now - broker.heartbeat_timeout):
        return
    for queue_name in queues:
        _dispatch_qsize(broker, queue_name, current_millis(), maintenance=True)


def _dispatch_qsize(broker: RedisBroker, queue_name: str, now_ms: int, *, maintenance: bool) -> None:
    # dispatch.lua's arguments, in the order RedisBroker._dispatch passes them (Dramatiq 2.x).
    broker.scripts["dispatch"](keys=[broker.namespace], args=[
        "qsize", now_ms, queue_name, broker.broker_id, broker.heartbeat_timeout,
        broker.dead_message_ttl, _DO_MAINTENANCE if maintenance else 0, broker._max_unpack_size()])
