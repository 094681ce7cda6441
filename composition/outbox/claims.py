"""The relay's statements on the outbox table: claim, mark sent, release.

A row is claimable when it is pending, its lease is absent or expired, and it is the oldest
pending row of its key. ``SKIP LOCKED`` skips a locked head row, so a key's later rows are never
taken on their own: they ride along only in the batch of the relay that holds the key's head,
which enqueues them in order. Nothing keeps an id cursor (ids are allocated at insert, not at
commit), so a row that commits late is still found. A relay that crashes after claiming leaves
leased rows that are claimed again once the lease expires: at least once, never lost.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from dramatiq.message import Message

from composition.outbox.models import OutboxMessage, message_id_for

__all__ = [
    "CLAIM_SQL",
    "MARK_SENT_SQL",
    "RELEASE_SQL",
    "ClaimedMessage",
    "claim",
    "execute_without_flush_wait",
    "mark_sent",
    "release",
]

CLAIM_SQL = """
WITH heads AS (
    SELECT o.id, o.key
    FROM {table} o
    WHERE o.status = 'pending'
      AND (o.claimed_until IS NULL OR o.claimed_until < now())
      AND (%(only_ids)s::bigint[] IS NULL OR o.id = ANY(%(only_ids)s::bigint[]))
      AND (o.key IS NULL OR NOT EXISTS (
            SELECT 1 FROM {table} p
            WHERE p.status = 'pending' AND p.key = o.key AND p.id < o.id))
    ORDER BY o.id
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
), followers AS (
    SELECT o.id
    FROM {table} o JOIN heads h ON o.key = h.key
    WHERE o.status = 'pending' AND o.id > h.id
      AND (o.claimed_until IS NULL OR o.claimed_until < now())
    ORDER BY o.id
    LIMIT %(limit)s
), picked AS (
    -- Cutting the union in id order keeps, for every key, a prefix of its pending rows.
    SELECT id FROM (SELECT id FROM heads UNION ALL SELECT id FROM followers) u
    ORDER BY id
    LIMIT %(limit)s
)
UPDATE {table} t
SET claimed_until = now() + make_interval(secs => %(lease_s)s),
    claimed_by = %(relay_id)s,
    attempts = t.attempts + 1
FROM picked
WHERE t.id = picked.id AND t.status = 'pending'
RETURNING t.id, t.actor_name, t.queue_name, t.payload, t.key, t.headers, t.delay_s, t.created_at
"""

# Only the claimant marks: a relay whose lease ran out and whose rows another relay claimed
# again leaves them to that relay (both sent them: at least once, never lost).
MARK_SENT_SQL = """
UPDATE {table} SET status = 'sent', sent_at = %(sent_at)s, claimed_until = NULL, last_error = ''
WHERE id = ANY(%(ids)s) AND status = 'pending' AND claimed_by = %(relay_id)s
"""

RELEASE_SQL = """
UPDATE {table} SET claimed_until = NULL, last_error = %(error)s
WHERE id = ANY(%(ids)s) AND status = 'pending' AND claimed_by = %(relay_id)s
"""


@dataclass(frozen=True)
class ClaimedMessage:
    """One claimed outbox row, as much of it as the relay needs."""

    id: int
    actor_name: str
    queue_name: str
    payload: dict[str, Any]
    key: str | None
    headers: dict[str, Any]
    delay_s: float | None
    created_at: datetime

    def to_message(self, now_s: float) -> tuple[Message[Any], int | None]:
        """The Dramatiq message (args=(), kwargs=payload) and its delay in ms (None: due now)."""
        delay_ms = None
        if self.delay_s:
            remaining_s = self.created_at.timestamp() + self.delay_s - now_s
            if remaining_s > 0:
                delay_ms = int(remaining_s * 1000)
        headers = {**self.headers, "outbox_id": self.id, "key": self.key}
        message: Message[Any] = Message(
            queue_name=self.queue_name, actor_name=self.actor_name, args=(), kwargs=self.payload,
            options={"composition": headers}, message_id=message_id_for(self.id),
            message_timestamp=int(now_s * 1000),
        )
        return message, delay_ms


def execute_without_flush_wait(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run one statement in its own short transaction whose commit does not wait for the WAL
    flush (``synchronous_commit`` off); return its rows (none for a statement without any).

    The relay's own bookkeeping (leases, sent marks) needs no durability: if a server crash
    loses the last few such commits, the rows are simply claimed and relayed again, which the
    relay's at-least-once contract (and the inbox ledger behind it) already covers. Not waiting
    for two fsyncs per batch is most of the relay's throughput on a real disk.
    """
    # Inside a caller's transaction the setting would cover the caller's own commit: leave it.
    relax = not connection.in_atomic_block
    with transaction.atomic(), connection.cursor() as cursor:
        if relax:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def _table() -> str:
    return connection.ops.quote_name(OutboxMessage._meta.db_table)


def _decode_json(value: Any) -> Any:
    # psycopg returns jsonb decoded; a raw cursor on another driver might hand back text.
    if isinstance(value, str | bytes):
        return json.loads(value)
    return value


def claim(*, limit: int, lease_s: float, relay_id: str,
          only_ids: Sequence[int] | None = None) -> list[ClaimedMessage]:
    """Lease up to ``limit`` claimable rows for ``lease_s`` seconds to ``relay_id`` (one short
    transaction, the only one that locks rows); oldest first.

    With ``only_ids``, only those rows can be a key's head (the rows a transaction just
    published); the rows of the same key that follow a claimed head ride along, whoever
    published them, so every key still leaves in publish order.
    """
    rows = execute_without_flush_wait(CLAIM_SQL.format(table=_table()), {
        "limit": limit, "lease_s": lease_s, "relay_id": relay_id,
        "only_ids": list(only_ids) if only_ids is not None else None})
    claimed = [ClaimedMessage(id=row[0], actor_name=row[1], queue_name=row[2], payload=_decode_json(row[3]),
                              key=row[4], headers=_decode_json(row[5]) or {}, delay_s=row[6], created_at=row[7])
               for row in rows]
    claimed.sort(key=lambda message: message.id)
    return claimed


def mark_sent(ids: Sequence[int], *, sent_at: datetime, relay_id: str) -> None:
    """Mark the rows ``ids`` that ``relay_id`` still holds sent at ``sent_at`` and drop their lease."""
    execute_without_flush_wait(MARK_SENT_SQL.format(table=_table()),
                               {"ids": list(ids), "sent_at": sent_at, "relay_id": relay_id})


def release(ids: Sequence[int], *, error: str, relay_id: str) -> None:
    """Give the rows ``ids`` that ``relay_id`` still holds back (lease dropped, ``error``
    recorded), so any relay claims them again at once."""
    with connection.cursor() as cursor:
        cursor.execute(RELEASE_SQL.format(table=_table()), {"ids": list(ids), "error": error, "relay_id": relay_id})
