"""Which messages waiting on the broker the running code cannot run, for ``manage.py jobs
check-compat``: Redis is read whole, message by message; RabbitMQ cannot be read without side
effects, so the outbox rows sent within the retry horizon stand for it. Each shape is bound with
``composition.jobs.compatibility.runnable``, as the database's rows are.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS
from dramatiq.broker import Broker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import xq_name

from composition.broker.keys import messages_key
from composition.jobs.compatibility import Problem, largest_first, runnable, sent_problems
from composition.jobs.versions import message_version
from composition.outbox.relay_actor import RELAY_QUEUE_NAME

__all__ = ["Report", "broker_problems"]

# Messages read from Redis per HSCAN call.
SCAN_BATCH = 1000


@dataclass
class Report:
    """What ``broker_problems`` found: the problems, how many messages it read, and RabbitMQ's
    message count per queue (None on Redis, where every message was read)."""

    problems: list[Problem] = field(default_factory=list)
    messages_read: int = 0
    queue_counts: dict[str, int] | None = None


# -- the broker -------------------------------------------------------------------------------------
# Redis: every queue's ready and delayed messages, read with HSCAN in batches and grouped here.
# RabbitMQ cannot be read without side effects, and what running workers prefetched (every
# delayed retry) is invisible: there, the outbox rows sent (or, delayed, due) within the retry
# horizon stand for the broker ("may have run": most did), and each queue's message count is
# reported. Messages sent straight through Dramatiq have no row, and are not seen.
def broker_problems(broker: Broker, *, sent_since: datetime, alias: str = DEFAULT_DB_ALIAS) -> Report:
    """What waits on the broker that the running code cannot run (see the module doc):
    ``sent_since`` bounds the outbox rows that stand for RabbitMQ's messages."""
    if isinstance(broker, RedisBroker):
        return _redis_report(broker)
    return Report(sent_problems(broker, sent_since, alias=alias), 0, _queue_counts(broker))


def _json_type(value: Any) -> str:
    """What ``composition.jobs.compatibility``'s SQL says of a JSON value's type."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return "null" if value is None else "number"


def _shape(actor: str, queue: str, args: list[Any], kwargs: dict[str, Any], version: Any) -> tuple[Any, ...]:
    """What ``_grouped`` groups by, for a message read from Redis."""
    shape: tuple[Any, ...] = (actor, queue, tuple(map(_json_type, args)),
                              tuple(sorted((key, _json_type(value)) for key, value in kwargs.items())),
                              json.dumps(version))
    task, task_args, task_kwargs = kwargs.get("task"), kwargs.get("args"), kwargs.get("kwargs")
    if isinstance(task, str) and isinstance(task_args, list) and isinstance(task_kwargs, dict):
        shape += (task, tuple(map(_json_type, task_args)),
                  tuple(sorted((key, _json_type(value)) for key, value in task_kwargs.items())))
    return shape


def _redis_messages(broker: RedisBroker) -> Iterator[tuple[str, bytes]]:
    """The id (its field in the queue's hash) and body of every message of every queue (ready and
    delayed, the ones workers hold included), not of Dramatiq's expiring dead-letter queues, nor
    the outbox relay's nudges (the library's own, run by any version of it)."""
    client = broker.client
    dead_letters = messages_key(broker.namespace, xq_name("*"))
    relay = messages_key(broker.namespace, RELAY_QUEUE_NAME + "*")
    for key in client.scan_iter(messages_key(broker.namespace, "*"), count=SCAN_BATCH):
        name = key.decode() if isinstance(key, bytes) else str(key)
        if fnmatch.fnmatchcase(name, dead_letters) or fnmatch.fnmatchcase(name, relay):
            continue
        for message_id, body in client.hscan_iter(name, count=SCAN_BATCH):
            yield (message_id.decode(errors="replace") if isinstance(message_id, bytes) else str(message_id)), body


def _redis_report(broker: RedisBroker) -> Report:
    groups: dict[tuple[Any, ...], list[Any]] = {}
    read = 0
    for message_id, body in _redis_messages(broker):
        read += 1
        try:
            message = json.loads(body)
            actor, args, kwargs = message["actor_name"], message.get("args") or [], message.get("kwargs") or {}
            queue = str(message["queue_name"])
            version = message_version(message.get("options") or {})
            shape = _shape(actor, queue, list(args), dict(kwargs), version)
        except (ValueError, KeyError, TypeError, AttributeError):
            shape = ("(unreadable)",)
            actor, queue, args, kwargs, version = "(unreadable)", "", [], {}, 1
        group = groups.get(shape)
        if group is None:
            # The hash field is the message id, readable when the body is not.
            groups[shape] = [1, message_id, actor, queue, args, kwargs, version]
        else:
            group[0] += 1
    found: dict[tuple[str, str], list[Any]] = {}
    for count, example, actor, queue, args, kwargs, version in groups.values():
        reason = ("not a Dramatiq message" if actor == "(unreadable)"
                  else runnable(broker, actor, list(args), dict(kwargs), version, queue_name=queue))
        if reason is not None:
            tally = found.setdefault((actor, reason), [0, example])
            tally[0] += count
    problems = [Problem("broker", actor, reason, count, example) for (actor, reason), (count, example) in found.items()]
    return Report(largest_first(problems), read, None)


def _queue_counts(broker: Broker) -> dict[str, int]:
    """Each declared queue's and delay queue's message count, read with a passive declare on a
    connection of its own (a queue that does not exist counts 0: it was never declared)."""
    import pika
    from dramatiq.common import dq_name

    # A cluster's nodes are a list, tried in order.
    counts: dict[str, int] = {}
    connection = pika.BlockingConnection(getattr(broker, "parameters", None))
    try:
        channel = connection.channel()
        for queue in sorted(broker.get_declared_queues()):
            for name in (queue, dq_name(queue)):
                try:
                    counts[name] = int(channel.queue_declare(name, passive=True).method.message_count)
                except pika.exceptions.ChannelClosedByBroker:  # 404: never declared
                    counts[name] = 0
                    channel = connection.channel()
    finally:
        connection.close()
    return counts
