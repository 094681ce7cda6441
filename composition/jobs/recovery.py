"""Giving a dead worker's messages back within seconds (Redis broker).

A Redis-broker worker keeps every message it fetched in an unacked set until it acknowledges
it. When the worker dies, Dramatiq moves those messages back to their queues only in its
"maintenance" step, which runs on one broker command in a thousand by chance, for one queue,
and only for workers silent for ``heartbeat_timeout``. So a crashed worker's messages came back
after minutes on an idle system, and late: their duplicates ran long after the work looked done.

``return_dead_workers_messages`` runs that same maintenance step (Dramatiq's own
``dispatch.lua``, so the queue layout and its rules stay Dramatiq's) on every queue this worker
consumes, now. ``BrokerKeepalive`` calls it at start and on every beat, so a restarted worker
takes its dead predecessor's messages back within ``BROKER_HEARTBEAT_TIMEOUT_S`` of the crash,
and a live worker, which beats every quarter of that timeout, is never taken for a dead one.

Except after a Redis outage longer than that timeout: then every worker's last beat is old, and
the first process to reach Redis again would take the live ones' messages (they run twice). So
a process whose own beats failed only beats for one timeout once they succeed again (the others
beat meanwhile), and holds Dramatiq's chance maintenance off as long (``BrokerKeepalive``).
Heartbeats carry each host's clock: hosts must agree on the time to well within the timeout.
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
