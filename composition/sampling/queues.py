"""The queues' side: each declared queue's depth and broker counts, the age of its oldest ready
message, and the dead letters still open per actor.

A queue's depth is ``composition.backpressure.depth.backlog``, as admission and the operations
page count it. The oldest message's age is read on Redis only: RabbitMQ cannot tell a queue
head's age without consuming it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from django.db.models import Count
from dramatiq import Message
from dramatiq.broker import Broker

from composition.backpressure.depth import BrokerCounts, backlog, broker_counts
from composition.broker.keys import is_work_queue, lanes_key, messages_key, queue_key
from composition.errors import described
from composition.jobs.deadletters import open_failures
from composition.outbox.models import OutboxMessage

__all__ = ["QueueSample", "declared_queues", "oldest_ready_age_s", "open_dead_letters_by_actor", "sample_queues"]

# KEYS: the queue's id list, its bodies hash, its priority lanes. The head of the list is the
# message that has waited longest of those without a priority (enqueue and requeue push on the
# right, fetch pops on the left); in the lanes, the first and the last (the highest and the lowest
# priority) stand for the rest: the lowest is the one left waiting behind the others.
_OLDEST_BODIES = """
local bodies = {}
local ids = {redis.call('lindex', KEYS[1], 0)}
for _, id in ipairs(redis.call('zrange', KEYS[3], 0, 0)) do table.insert(ids, id) end
for _, id in ipairs(redis.call('zrange', KEYS[3], -1, -1)) do table.insert(ids, id) end
for _, id in ipairs(ids) do
    if id then
        local body = redis.call('hget', KEYS[2], id)
        if body then table.insert(bodies, body) end
    end
end
return bodies
"""


@dataclass(frozen=True)
class QueueSample:
    """One queue: its pending outbox rows; the broker's counts (None when the broker could not
    be asked, ``error`` then says why); the oldest ready message's age in seconds (None when not
    measured: RabbitMQ, or the broker failed)."""

    queue: str
    outbox_pending: int
    broker: BrokerCounts | None
    oldest_age_s: float | None
    error: str | None = None

    @property
    def depth(self) -> int:
        return backlog(self.outbox_pending, self.broker)


def declared_queues(broker: Broker) -> list[str]:
    """The queues declared on ``broker``, without their delay and dead-letter queues."""
    return sorted(name for name in broker.get_declared_queues() if is_work_queue(name))


def oldest_ready_age_s(broker: Broker, queue: str, *, now_s: float | None = None) -> float | None:
    """Seconds the oldest ready message of ``queue`` has waited (0.0 when the queue is empty);
    None on a broker other than Redis. Raises the broker's errors."""
    client: Any = getattr(broker, "client", None)
    if client is None:
        return None
    namespace = getattr(broker, "namespace", "dramatiq")
    bodies = client.eval(_OLDEST_BODIES, 3, queue_key(namespace, queue), messages_key(namespace, queue),
                         lanes_key(namespace, queue))
    now_ms = (time.time() if now_s is None else now_s) * 1000
    ages = [0.0]  # empty, or the heads were acked between the reads
    for body in bodies:
        message = Message.decode(body)
        ready_since_ms = max(float(message.message_timestamp), float(message.options.get("eta") or 0))
        ages.append(max(0.0, (now_ms - ready_since_ms) / 1000))
    return max(ages)


def _outbox_pending_by_queue() -> dict[str, int]:
    return {str(queue): int(count) for queue, count in
            OutboxMessage.objects.filter(status=OutboxMessage.Status.PENDING)
            .values_list("queue_name").annotate(n=Count("id")).order_by()}


def sample_queues(broker: Broker, queues: list[str] | None = None) -> list[QueueSample]:
    """Every queue of ``queues`` (default: the declared ones, plus any with pending outbox rows):
    one grouped COUNT of the outbox, then per queue one broker round trip for its counts and, on
    Redis, one for its oldest message. A broker error is recorded on the queue's sample, never
    raised, and the queues after it are not asked (a frozen broker costs one socket timeout per
    round, not one per queue); database errors propagate."""
    pending = _outbox_pending_by_queue()
    names = sorted(set(declared_queues(broker)) | set(pending)) if queues is None else queues
    samples = []
    failed: str | None = None
    for queue in names:
        if failed is None:
            try:
                samples.append(QueueSample(queue, pending.get(queue, 0), broker_counts(queue, broker),
                                           oldest_ready_age_s(broker, queue)))
                continue
            except Exception as exc:  # the broker is down: the outbox side is still worth reporting
                failed = described(exc)
        samples.append(QueueSample(queue, pending.get(queue, 0), None, None, error=failed))
    return samples


def open_dead_letters_by_actor() -> dict[str, int]:
    """``open_failures()`` per actor (one grouped COUNT on the indexed status)."""
    return {str(actor): int(count) for actor, count in
            open_failures().values_list("actor").annotate(n=Count("id")).order_by()}
