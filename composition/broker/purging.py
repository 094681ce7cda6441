"""Taking a queue's waiting messages off the broker, each only once its record is committed.

``take_waiting(broker, queue, record, limit=)`` hands the bodies of ``queue``'s ready messages to
``record`` in batches; a batch leaves the broker only after ``record`` returned. Redis: one script
moves a batch off the list and lanes into a holding hash (``keys.purging_key``), released after
``record``; what a dead purge left held is recorded first. RabbitMQ: ``basic_get``, then one
``basic_ack(multiple=True)`` per batch; a dead purge's batch goes back with its connection.
Messages a worker holds (running, prefetched, delayed until due) are not waiting, and stay.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from dramatiq.broker import Broker

from composition.broker.keys import lanes_key, messages_key, purging_key, queue_key
from composition.errors import CompositionError

__all__ = ["BATCH", "NotPurgeable", "take_waiting"]

# Messages per Redis script call and per RabbitMQ acknowledgement: one script moving a thousand
# ids keeps Redis busy for about a millisecond, not for the whole queue.
BATCH = 500

# KEYS = the queue's list, its lanes, its messages hash, the holding hash; ARGV = the most ids to
# take. Returns how many ids it looked at and the ids it took, in queue order: the holding hash
# does not keep one (past 128 entries HGETALL's order is the hash table's), and a group of dead
# letters is replayed in id order. A listed id with no body (acked meanwhile) is dropped.
_TAKE_LUA = """
local limit = tonumber(ARGV[1])
local taken = {}
local function take(id)
    local body = redis.call("hget", KEYS[3], id)
    if body then
        redis.call("hset", KEYS[4], id, body)
        redis.call("hdel", KEYS[3], id)
        taken[#taken + 1] = id
    end
end
local ids = redis.call("lrange", KEYS[1], 0, limit - 1)
for _, id in ipairs(ids) do
    take(id)
end
if #ids > 0 then
    redis.call("ltrim", KEYS[1], #ids, -1)
end
local looked = #ids
if #ids < limit then
    local laned = redis.call("zrange", KEYS[2], 0, limit - #ids - 1)
    for _, id in ipairs(laned) do
        take(id)
        redis.call("zrem", KEYS[2], id)
    end
    looked = looked + #laned
end
return {looked, taken}
"""

Record = Callable[[Sequence[bytes]], None]


class NotPurgeable(CompositionError):
    """The broker is neither Redis nor RabbitMQ: there is no way to take its messages."""


def take_waiting(broker: Broker, queue: str, record: Record, *, limit: int) -> int:
    """Take up to ``limit`` ready messages of ``queue`` (more on Redis when a purge that died left
    some held), handing their bodies to ``record`` a batch at a time; returns how many were
    taken. A batch leaves the broker only after ``record`` returned; should it raise, the batch
    stays held (Redis, until the next purge of the queue) or goes back to the queue (RabbitMQ)."""
    client: Any = getattr(broker, "client", None)
    if client is not None:
        return _take_redis(client, getattr(broker, "namespace", "dramatiq"), queue, record, limit)
    # Without importing pika (an optional extra): a broker is a RabbitMQ one only once its module is.
    rabbitmq = sys.modules.get("composition.broker.rabbitmq")
    if rabbitmq is not None and isinstance(broker, rabbitmq.PausableRabbitmqBroker):
        return _take_rabbitmq(broker, queue, record, limit)
    raise NotPurgeable(f"{type(broker).__name__} cannot be purged: only the Redis and RabbitMQ brokers can")


def _record_held(client: Any, holding: str, record: Record) -> int:
    """Record and release what ``holding`` holds; how many."""
    done = 0
    while held := client.hgetall(holding):
        ids = list(held)[:BATCH]
        record([held[redis_id] for redis_id in ids])
        client.hdel(holding, *ids)
        done += len(ids)
    return done


def _take_redis(client: Any, namespace: str, queue: str, record: Record, limit: int) -> int:
    holding = purging_key(namespace, queue)
    take = client.register_script(_TAKE_LUA)
    keys = [queue_key(namespace, queue), lanes_key(namespace, queue), messages_key(namespace, queue), holding]
    left_held = _record_held(client, holding, record)  # what a purge that died left, beyond ``limit``
    looked_at = taken = 0
    while looked_at < limit:
        looked, ids = take(keys=keys, args=[min(BATCH, limit - looked_at)])
        if not looked:
            break
        looked_at += looked
        if ids:
            record([body for body in client.hmget(holding, ids) if body is not None])
            client.hdel(holding, *ids)
            taken += len(ids)
    return left_held + taken


def _take_rabbitmq(broker: Any, queue: str, record: Record, limit: int) -> int:
    channel = broker.channel  # this thread's, as Dramatiq's own calls use
    taken = 0
    try:
        while taken < limit:
            batch: list[tuple[int, bytes]] = []
            while len(batch) < min(BATCH, limit - taken):
                method, _, body = channel.basic_get(queue, auto_ack=False)
                if method is None:
                    break
                batch.append((method.delivery_tag, body))
            if not batch:
                break
            record([body for _, body in batch])
            channel.basic_ack(batch[-1][0], multiple=True)
            taken += len(batch)
    finally:
        # A batch not acknowledged goes back to the queue with the connection, not at its timeout.
        del broker.connection
    return taken

