"""Enqueue many Dramatiq messages at once, in Dramatiq's own format and queue layout.

For the Redis broker a whole batch is one ``EVALSHA`` of a small script that performs, message
by message and in order, exactly what Dramatiq's ``dispatch.lua`` does for one ``enqueue``
(``HSET`` of the encoded message under a fresh Redis id, ``RPUSH`` of that id), so Dramatiq
workers consume the result unchanged; the broker's enqueue middleware hooks still run for every
message. Other brokers (RabbitMQ) get one ``broker.enqueue()`` per message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import uuid4

from dramatiq.broker import Broker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis, dq_name
from dramatiq.message import Message

__all__ = ["enqueue_many"]

# Kept in the module rather than a .lua file so it ships with the package without package-data.
_ENQUEUE_MANY_LUA = """
-- Enqueue a batch of Dramatiq messages exactly as Dramatiq's own dispatch.lua "enqueue" command
-- does for one: HSET $ns:$queue.msgs <redis_message_id> <data>, then RPUSH $ns:$queue <id>, in
-- batch order; and refresh this broker's heartbeat once, as every dispatch call does.
--
-- KEYS = [namespace]
-- ARGV = [timestamp_ms, broker_id, queue_1, id_1, data_1, queue_2, id_2, data_2, ...]
local namespace = KEYS[1]
redis.call("zadd", namespace .. ":__heartbeats__", ARGV[1], ARGV[2])
local count = 0
for i = 3, #ARGV, 3 do
    local queue_full_name = namespace .. ":" .. ARGV[i]
    redis.call("hset", queue_full_name .. ".msgs", ARGV[i + 1], ARGV[i + 2])
    redis.call("rpush", queue_full_name, ARGV[i + 1])
    count = count + 1
end
return count
"""
# Arguments per EVALSHA: a 500-message batch is ~1,500 arguments, and one script call runs in
# about a millisecond of Redis time; bigger batches are split so Redis is never blocked for long.
_MAX_MESSAGES_PER_CALL = 1000


def enqueue_many(broker: Broker, items: Sequence[tuple[Message[Any], int | None]]) -> list[Message[Any]]:
    """Enqueue ``(message, delay_ms)`` pairs in order; return the messages as enqueued.

    Raises whatever the broker raises; with the Redis broker a failed call enqueues none of its
    messages, with other brokers the messages before the failure stay enqueued.
    """
    if isinstance(broker, RedisBroker):
        return _enqueue_redis(broker, items)
    return [broker.enqueue(message, delay=delay_ms) for message, delay_ms in items]


def _enqueue_redis(broker: RedisBroker, items: Sequence[tuple[Message[Any], int | None]]) -> list[Message[Any]]:
    if not items:
        return []
    script = broker.client.register_script(_ENQUEUE_MANY_LUA)
    now_ms = current_millis()
    enqueued: list[tuple[Message[Any], int | None]] = []
    for start in range(0, len(items), _MAX_MESSAGES_PER_CALL):
        chunk: list[tuple[Message[Any], int | None]] = []
        args: list[Any] = [now_ms, broker.broker_id]
        for message, delay_ms in items[start:start + _MAX_MESSAGES_PER_CALL]:
            # As in RedisBroker.enqueue: every enqueue gets its own Redis id, since the same
            # Dramatiq message id may legitimately be enqueued again.
            options: dict[str, Any] = {"redis_message_id": str(uuid4())}
            queue_name = message.queue_name
            if delay_ms is not None:
                queue_name = dq_name(queue_name)
                options["eta"] = now_ms + delay_ms
            message = message.copy(queue_name=queue_name, options=options)
            broker.emit_before("enqueue", message, delay_ms)
            args += (queue_name, options["redis_message_id"], message.encode())
            chunk.append((message, delay_ms))
        script(keys=[broker.namespace], args=args)
        enqueued += chunk
        for message, delay_ms in chunk:
            broker.emit_after("enqueue", message, delay_ms)
    return [message for message, _ in enqueued]
