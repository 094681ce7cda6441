"""A queue short of messages: the Redis broker holds fewer than its sent idempotent jobs that
never ran, which proves it lost some (``short_queue``; ``composition.jobs.broker_losses`` acts on it).

A job's message stays on the broker (ready, taken, delayed or dead) until its ledger row or dead
letter has committed. What a changer must keep: the broker is read after the time limit on the
rows counted and before the ledger is, so every row counted had its message on the broker when
it was read; only then is a shortfall a proof. Only the newest rows are looked at: a loss of old
messages under a backlog of ``COUNT_CHECK_MAX_ROWS`` or more goes unseen.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection
from dramatiq.common import dq_name, xq_name

from composition.broker.keys import messages_key
from composition.conf import conf
from composition.db.jsonb import decoded
from composition.jobs.inbox import ledger_key_of
from composition.jobs.models import DeadLetter, ProcessedMessage
from composition.outbox.models import OutboxMessage, message_id_for

__all__ = ["COUNT_CHECK_MARGIN_S", "COUNT_CHECK_MAX_ROWS", "Shortfall", "never_ran", "short_queue"]

# At most this many sent rows of a queue are looked at: a queue whose broker holds more messages
# cannot be shown short of them this cheaply.
COUNT_CHECK_MAX_ROWS = 5_000
# Rows stamped sent less than this before the broker was read are not counted: the relay stamps a
# row after its enqueue, by its own host's clock, which may be off the database's by this much.
COUNT_CHECK_MARGIN_S = 5.0


@dataclass(frozen=True)
class Shortfall:
    """A queue whose broker held fewer messages than it had sent idempotent rows not yet run."""

    queue: str
    held: int
    unfinished: int

    def __str__(self) -> str:
        return f"queue {self.queue}: {self.held} messages on the broker for {self.unfinished} sent, unfinished jobs"


_NEWEST_SENT_SQL = """
SELECT o.id, o.headers
FROM {outbox} o
WHERE o.status = 'sent' AND o.queue_name = %(queue)s AND o.actor_name = ANY(%(actors)s::text[])
  AND o.sent_at < %(before)s AND o.sent_at >= %(since)s
ORDER BY o.sent_at DESC
LIMIT %(limit)s
"""


def never_ran(rows: Iterable[tuple[int, Any]]) -> list[int]:
    """The ids of the outbox ``rows`` (id, headers) with neither a ledger row nor a dead letter;
    headers as a raw query returns the column (``composition.db.jsonb``)."""
    rows = [(pk, decoded(headers)) for pk, headers in rows]
    message_ids = {pk: message_id_for(pk) for pk, _ in rows}
    # A replay's ledger key is its original message's id, in its headers.
    ledger_keys = {pk: ledger_key_of(headers, message_ids[pk]) for pk, headers in rows}
    ran = set(ProcessedMessage.objects.filter(message_id__in=ledger_keys.values())
              .values_list("message_id", flat=True))
    failed = set(DeadLetter.objects.filter(message_id__in=message_ids.values())
                 .values_list("message_id", flat=True))
    return [pk for pk, _ in rows if ledger_keys[pk] not in ran and message_ids[pk] not in failed]


def short_queue(client: Any, namespace: str, queues: Mapping[str, Iterable[str]]) -> Shortfall | None:
    """The first of ``queues`` (queue name: its idempotent jobs' names) whose Redis broker
    (``client``, ``namespace``) holds fewer messages than it has sent rows that never ran (see
    module doc), or None."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        (now,) = cursor.fetchone()
    # Every row counted below was sent before this, so its message was on the broker when it was
    # read; and it stays there until the ledger row or dead letter the count would have seen.
    before = now - timedelta(seconds=COUNT_CHECK_MARGIN_S)
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        for name in (queue, dq_name(queue), xq_name(queue)):
            pipe.hlen(messages_key(namespace, name))
    counts = [int(count) for count in pipe.execute()]
    outbox = connection.ops.quote_name(OutboxMessage._meta.db_table)
    since = now - timedelta(seconds=float(conf.BROKER_LOSS_LOOKBACK_S))
    for index, (queue, actors) in enumerate(queues.items()):
        held = sum(counts[3 * index:3 * index + 3])
        if held >= COUNT_CHECK_MAX_ROWS:
            continue
        with connection.cursor() as cursor:
            cursor.execute(_NEWEST_SENT_SQL.format(outbox=outbox), {
                "queue": queue, "actors": sorted(actors), "before": before, "since": since,
                "limit": min(COUNT_CHECK_MAX_ROWS, 2 * held + 100)})
            rows = cursor.fetchall()
        if len(rows) > held and len(unfinished := never_ran(rows)) > held:
            return Shortfall(queue, held, len(unfinished))
    return None
