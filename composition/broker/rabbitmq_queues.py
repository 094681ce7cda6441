"""How the RabbitMQ broker declares a queue, its delay queue (``.DQ``) and its dead queue (``.XQ``):
classic queues as Dramatiq does, or quorum queues (``RABBITMQ_QUEUE_TYPE = "quorum"``), replicated
over a cluster's nodes (RabbitMQ 3.10 or later: message TTLs on them).

A quorum work queue gets ``x-delivery-limit`` (``RABBITMQ_DELIVERY_LIMIT``): a message returned
that many times goes to the dead queue, as Dramatiq's rejected ones do. RabbitMQ never changes a
queue's arguments, so ``declare`` raises ``QueueArgumentsConflict``, saying what to do, for a
name that exists with others. (pika is imported only where a queue is declared.)
"""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error
from dramatiq.common import dq_name, xq_name

from composition.errors import BrokerConfigurationError

__all__ = ["QUEUE_TYPES", "UNLIMITED_DELIVERIES", "QueueArgumentsConflict", "check_rabbitmq_queue_settings",
           "dead_queue_arguments", "declare", "delay_queue_arguments", "work_queue_arguments"]

QUEUE_TYPES = ("classic", "quorum")
# A delay queue's messages come back at every consumer restart, held until due: no limit may
# dead-letter them. Stated, not left out: RabbitMQ 4 gives a quorum queue without one a limit of 20.
UNLIMITED_DELIVERIES = 2**31 - 1
_PRECONDITION_FAILED = 406


class QueueArgumentsConflict(BrokerConfigurationError):
    """A queue of this name exists on RabbitMQ with other arguments than the settings ask for."""

    def __init__(self, queue_name: str, reply: str) -> None:
        canonical = queue_name.removesuffix(".DQ").removesuffix(".XQ")
        super().__init__(
            f"RabbitMQ refused to declare queue {queue_name!r} as the settings ask ({reply}): a queue of that "
            f"name exists with other arguments (its type, x-max-priority, x-delivery-limit), and RabbitMQ never "
            f"changes them. Drain it with workers on the old settings and delete it (rabbitmqctl delete_queue "
            f"{canonical}, {dq_name(canonical)} and {xq_name(canonical)}), or move the jobs to new queue names "
            f"(docs/deployment.md, 'RabbitMQ quorum queues'). Nothing was enqueued to it.")
        self.queue_name = queue_name


# Quorum queues take no x-max-priority (RabbitMQ 3.x has no priorities on them; 4.x has two
# levels, not used here).
def work_queue_arguments(queue_name: str, *, queue_type: str, max_priority: int | None,
                         delivery_limit: int) -> dict[str, Any]:
    """The arguments of a work queue: rejected messages go to its dead queue (as Dramatiq's)."""
    arguments: dict[str, Any] = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": xq_name(queue_name)}
    if queue_type == "quorum":
        arguments["x-queue-type"] = "quorum"
        arguments["x-delivery-limit"] = delivery_limit
    elif max_priority:
        arguments["x-max-priority"] = max_priority
    return arguments


def delay_queue_arguments(queue_name: str, *, queue_type: str, max_priority: int | None) -> dict[str, Any]:
    """The arguments of a work queue's delay queue: as the work queue's, its delivery limit
    unreachable (``UNLIMITED_DELIVERIES``)."""
    return work_queue_arguments(queue_name, queue_type=queue_type, max_priority=max_priority,
                                delivery_limit=UNLIMITED_DELIVERIES)


def dead_queue_arguments(*, queue_type: str) -> dict[str, Any]:
    """The arguments of a dead queue: its messages expire after Dramatiq's week."""
    from dramatiq.brokers.rabbitmq import DEAD_MESSAGE_TTL

    arguments: dict[str, Any] = {"x-message-ttl": DEAD_MESSAGE_TTL}
    if queue_type == "quorum":
        arguments["x-queue-type"] = "quorum"
    return arguments


def declare(broker: Any, queue_name: str, arguments: dict[str, Any]) -> Any:
    """``queue_declare`` (durable) on the calling thread's channel of ``broker``; raises
    ``QueueArgumentsConflict`` when a queue of that name exists with other arguments (the channel
    RabbitMQ closed is dropped, so the thread's next call opens another)."""
    import pika.exceptions

    try:
        return broker.channel.queue_declare(queue=queue_name, durable=True, arguments=arguments)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code != _PRECONDITION_FAILED:
            raise
        del broker.channel
        raise QueueArgumentsConflict(queue_name, exc.reply_text) from None


def check_rabbitmq_queue_settings(merged: dict[str, Any]) -> list[CheckMessage]:
    """The RabbitMQ queue settings of a merged ``COMPOSITION`` (called by ``composition.checks``)."""
    messages: list[CheckMessage] = []
    queue_type, limit = merged["RABBITMQ_QUEUE_TYPE"], merged["RABBITMQ_DELIVERY_LIMIT"]
    if queue_type not in QUEUE_TYPES:
        messages.append(Error(f"COMPOSITION['RABBITMQ_QUEUE_TYPE'] must be one of {QUEUE_TYPES}, got {queue_type!r}.",
                              id="composition.E014"))
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        messages.append(Error(f"COMPOSITION['RABBITMQ_DELIVERY_LIMIT'] must be a positive integer, got {limit!r}.",
                              id="composition.E015"))
    if queue_type == "quorum" and merged["RABBITMQ_MAX_PRIORITY"] is not None:
        messages.append(Error(
            "COMPOSITION['RABBITMQ_MAX_PRIORITY'] is set, but RABBITMQ_QUEUE_TYPE is 'quorum': quorum queues take "
            "no x-max-priority.", hint="Unset it; django.tasks priorities other than 0 are then refused "
            "(docs/tasks.md, 'Priorities').", id="composition.E016"))
    return messages
