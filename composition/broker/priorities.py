"""Message priorities (``django.tasks``' -100..100, higher first) and how each broker honours them.

A priority travels in a message's options (``PRIORITY_OPTION``), set from its outbox row's
``PRIORITY_HEADER``; none is 0. On Redis it waits in its queue's priority lanes (``LANES_LUA``),
exactly ordered; on RabbitMQ it is one of ``RABBITMQ_MAX_PRIORITY`` levels (``rabbitmq_priority``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["LANES_LUA", "MAX_PRIORITY", "MIN_PRIORITY", "PRIORITY_HEADER", "PRIORITY_OPTION", "message_priority",
           "rabbitmq_priority", "unhonoured_priority"]

PRIORITY_HEADER = "message_priority"
PRIORITY_OPTION = "composition_priority"
MIN_PRIORITY = -100
MAX_PRIORITY = 100

# Redis: a message with a priority other than 0 waits in a sorted set beside its queue's list
# (``<ns>:<queue>.lanes``), scored (MAX_PRIORITY - priority) * 1e13 + an enqueue counter, so a
# higher priority sorts first and equal ones keep their order (above LOW_LANES_FROM: below 0). A
# fetch first moves the lanes' messages above 0 to the head of the list, and those below 0 to its
# tail while the list is shorter than the fetch, so the highest waiting is fetched first. A message
# handed back (a drain, a dead worker's recovery) goes to the list's tail and loses its place.
# Lua functions for the scripts that enqueue and fetch (composition.broker.redis, the outbox's
# batched enqueue), on Dramatiq's key layout (composition.broker.keys):
# - to_lanes(queue_full_name, message_id, priority): put an id in the lanes instead of the list;
# - from_lanes(queue_full_name, prefetch): move what a fetch of ``prefetch`` should see first.
LANES_LUA = """
local LOW_LANES_FROM = 1e15
local function to_lanes(queue_full_name, message_id, priority)
    local lanes = queue_full_name .. ".lanes"
    local order = redis.call("incr", lanes .. ".seq")
    redis.call("zadd", lanes, string.format("%.0f", (100 - priority) * 1e13 + order), message_id)
end
local function from_lanes(queue_full_name, prefetch)
    local lanes = queue_full_name .. ".lanes"
    if redis.call("exists", lanes) == 0 then
        return
    end
    local high = redis.call("zrangebyscore", lanes, "-inf", "(" .. string.format("%.0f", LOW_LANES_FROM),
                            "LIMIT", 0, prefetch)
    for i = #high, 1, -1 do
        redis.call("lpush", queue_full_name, high[i])
    end
    if #high > 0 then
        redis.call("zrem", lanes, unpack(high))
    end
    local room = prefetch - redis.call("llen", queue_full_name)
    if room > 0 then
        local low = redis.call("zrangebyscore", lanes, "(" .. string.format("%.0f", LOW_LANES_FROM), "+inf",
                               "LIMIT", 0, room)
        for i = 1, #low do
            redis.call("rpush", queue_full_name, low[i])
        end
        if #low > 0 then
            redis.call("zrem", lanes, unpack(low))
        end
    end
end
"""


def message_priority(options: Mapping[str, Any]) -> int:
    """The priority in a message's ``options``; 0 when it has none (or not a valid one)."""
    priority = options.get(PRIORITY_OPTION)
    if isinstance(priority, bool) or not isinstance(priority, int) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        return 0
    return priority


def rabbitmq_priority(options: Mapping[str, Any], max_priority: int | None) -> int | None:
    """The AMQP priority (``0..max_priority``) of a message with ``options`` on queues declared
    with ``x-max-priority`` ``max_priority``; None (no priority property) when they are not.
    Several of ours share one level; RabbitMQ orders what waits in a queue, not what a consumer
    has prefetched."""
    if not max_priority:
        return None
    return round((message_priority(options) - MIN_PRIORITY) * max_priority / (MAX_PRIORITY - MIN_PRIORITY))


def unhonoured_priority(priority: int, *, broker: str, queue_type: str, max_priority: int | None) -> str | None:
    """Why a message of ``priority`` (other than 0) could not be honoured on a ``broker``
    (``broker_kind``) whose RabbitMQ queues are ``queue_type`` with ``max_priority``; None when it
    can. Refused at publish: otherwise it would run in plain order, silently."""
    if priority == 0 or broker != "rabbitmq":
        return None
    if queue_type == "quorum":
        return (f"priority {priority}: the RabbitMQ queues are quorum queues, which have no priorities here; use 0, "
                "or classic queues with RABBITMQ_MAX_PRIORITY (docs/tasks.md, 'Priorities')")
    if not max_priority:
        return (f"priority {priority}: RabbitMQ honours priorities only on queues declared with x-max-priority; "
                "set COMPOSITION['RABBITMQ_MAX_PRIORITY'] (docs/tasks.md, 'Priorities')")
    return None
