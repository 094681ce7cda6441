"""Enqueue many Dramatiq messages at once, in Dramatiq's own format and queue layout.

Redis: one ``EVALSHA`` per batch doing, message by message, what ``dispatch.lua`` does for one
``enqueue``, and pushing the wake tokens (``composition.broker.redis``). RabbitMQ: one
publisher-confirm round trip per batch (``composition.outbox.rabbitmq``). Other brokers: one
``broker.enqueue()`` per message. The broker's enqueue hooks run for every message, and Dramatiq
workers consume the result unchanged.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeGuard
from uuid import uuid4

from dramatiq.broker import Broker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis, dq_name
from dramatiq.message import Message

from composition.broker.priorities import LANES_LUA, message_priority
from composition.broker.redis import WAKE_LUA, WakingRedisBroker, wake_args
from composition.conf import conf

if TYPE_CHECKING:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

__all__ = ["enqueue_many", "is_rabbitmq"]

# Kept in the module rather than a .lua file so it ships with the package without package-data.
_ENQUEUE_MANY_LUA = WAKE_LUA + LANES_LUA + """
-- Enqueue a batch of Dramatiq messages exactly as Dramatiq's own dispatch.lua "enqueue" command
-- does for one: HSET $ns:$queue.msgs <redis_message_id> <data>, then RPUSH $ns:$queue <id> (or,
-- with a priority other than 0, into the queue's lanes: composition.broker.priorities), in batch
-- order; refresh this broker's heartbeat once, as every dispatch call does; then push the batch's
-- wake tokens (composition.broker.redis.WAKE_LUA).
--
-- KEYS = [namespace]
-- ARGV = [timestamp_ms, broker_id, message_count, queue_1, id_1, data_1, priority_1, queue_2, ...,
--         then push_wake_tokens' arguments (composition.broker.redis.wake_args)]
local namespace = KEYS[1]
redis.call("zadd", namespace .. ":__heartbeats__", ARGV[1], ARGV[2])
local count = tonumber(ARGV[3])
local first_wake_arg = 4 + 4 * count
for i = 4, first_wake_arg - 1, 4 do
    local queue_full_name = namespace .. ":" .. ARGV[i]
    redis.call("hset", queue_full_name .. ".msgs", ARGV[i + 1], ARGV[i + 2])
    local priority = tonumber(ARGV[i + 3])
    if priority == 0 then
        redis.call("rpush", queue_full_name, ARGV[i + 1])
    else
        to_lanes(queue_full_name, ARGV[i + 1], priority)
    end
end
push_wake_tokens(first_wake_arg)
return count
"""
# Arguments per EVALSHA: a 500-message batch is ~1,500 arguments, and one script call runs in
# about a millisecond of Redis time; bigger batches are split so Redis is never blocked for long.
_MAX_MESSAGES_PER_CALL = 1000


def enqueue_many(broker: Broker, items: Sequence[tuple[Message[Any], int | None]]) -> list[Message[Any]]:
    """Enqueue ``(message, delay_ms)`` pairs in order; return the messages as enqueued.

    Raises whatever the broker raises; with the Redis broker a failed call enqueues none of its
    messages, with other brokers the messages before the failure may stay enqueued. With the
    RabbitMQ broker it returns only once RabbitMQ has confirmed every message, and raises
    (``composition.outbox.rabbitmq.MessagesRejected``, ``ConfirmTimeout``) when RabbitMQ nacks
    or returns any of them, or does not confirm them within ``BROKER_SOCKET_TIMEOUT_S``.
    """
    if isinstance(broker, RedisBroker):
        return _enqueue_redis(broker, items)
    if is_rabbitmq(broker):
        # Imported here: pika, which that module needs, is the optional "rabbitmq" extra.
        from composition.outbox.rabbitmq import enqueue_confirmed

        return enqueue_confirmed(broker, items, confirm_timeout_s=float(conf.BROKER_SOCKET_TIMEOUT_S))
    return [broker.enqueue(message, delay=delay_ms) for message, delay_ms in items]


def is_rabbitmq(broker: Broker) -> TypeGuard[RabbitmqBroker]:
    """Whether ``broker`` is a ``RabbitmqBroker``, without importing pika: a broker can only be
    one once its module is imported."""
    module = sys.modules.get("dramatiq.brokers.rabbitmq")
    return module is not None and isinstance(broker, module.RabbitmqBroker)


def _enqueue_redis(broker: RedisBroker, items: Sequence[tuple[Message[Any], int | None]]) -> list[Message[Any]]:
    if not items:
        return []
    script = broker.client.register_script(_ENQUEUE_MANY_LUA)
    lanes = isinstance(broker, WakingRedisBroker)
    now_ms = current_millis()
    enqueued: list[tuple[Message[Any], int | None]] = []
    for start in range(0, len(items), _MAX_MESSAGES_PER_CALL):
        chunk: list[tuple[Message[Any], int | None]] = []
        batch = items[start:start + _MAX_MESSAGES_PER_CALL]
        args: list[Any] = [now_ms, broker.broker_id, len(batch)]
        for message, delay_ms in batch:
            # As in RedisBroker.enqueue: every enqueue gets its own Redis id, since the same
            # Dramatiq message id may legitimately be enqueued again.
            options: dict[str, Any] = {"redis_message_id": str(uuid4())}
            queue_name = message.queue_name
            if delay_ms is not None:
                queue_name = dq_name(queue_name)
                options["eta"] = now_ms + delay_ms
            message = message.copy(queue_name=queue_name, options=options)
            broker.emit_before("enqueue", message, delay_ms)
            # A delayed message's priority counts once it is due (moved to its queue then); only a
            # WakingRedisBroker's fetch reads the lanes.
            priority = message_priority(message.options) if delay_ms is None and lanes else 0
            args += (queue_name, options["redis_message_id"], message.encode(), priority)
            chunk.append((message, delay_ms))
        args += wake_args(broker, [message.queue_name for message, _ in chunk])
        script(keys=[broker.namespace], args=args)
        enqueued += chunk
        for message, delay_ms in chunk:
            broker.emit_after("enqueue", message, delay_ms)
    return [message for message, _ in enqueued]
