"""Dramatiq's Redis key names, as its ``dispatch.lua`` lays them out, spelled once for the code
that reads them (the Lua scripts that write them follow the same layout)."""

from __future__ import annotations

from dramatiq.common import dq_name, q_name

__all__ = ["acks_key", "dq_name", "fence_key", "is_work_queue", "lanes_key", "messages_key", "purging_key", "queue_key"]


def queue_key(namespace: str, queue: str) -> str:
    """The list of ready message ids, oldest first."""
    return f"{namespace}:{queue}"


def lanes_key(namespace: str, queue: str) -> str:
    """The sorted set of ready message ids with a priority (``composition.broker.priorities``);
    ours, not Dramatiq's, beside it its enqueue counter (``.seq``)."""
    return f"{namespace}:{queue}.lanes"


def messages_key(namespace: str, queue: str) -> str:
    """The hash of message bodies by Redis message id, each kept until its message is acked."""
    return f"{namespace}:{queue}.msgs"


def purging_key(namespace: str, queue: str) -> str:
    """The hash of message bodies by Redis message id that a purge took off ``queue`` and has not
    yet recorded as dead letters (ours, not Dramatiq's: ``composition.broker.purging``)."""
    return f"{namespace}:{queue}.purging"


def acks_key(namespace: str, broker_id: str, queue: str) -> str:
    """The ids one worker (``broker_id``) has fetched from ``queue`` and not yet acked."""
    return f"{namespace}:__acks__.{broker_id}.{queue}"


def fence_key(namespace: str, broker_id: str, queue: str) -> str:
    """The counter that fences one worker's fetches from ``queue`` (ours, not Dramatiq's:
    ``composition.broker.redis_holdings``)."""
    return f"{namespace}:__fence__.{broker_id}.{queue}"


def is_work_queue(queue: str) -> bool:
    """False for a delay (``.DQ``) or dead-letter (``.XQ``) queue."""
    return q_name(queue) == queue
