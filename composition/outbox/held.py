"""Long delays wait in the outbox, not in a broker.

A publish delayed longer than ``OUTBOX_HELD_DELAY_S`` writes its rows ``held``, with ``due_at``
(publish time plus the delay), and nothing is sent or nudged. Each sweep of the relay first makes
the rows that came due pending (``release_due``) and relays them as any other. So no broker
consumer holds it (RabbitMQ closes one that holds a message past its ``consumer_timeout``) and no
Redis keeps it in memory for hours. A held row is no backlog: depth, backpressure and the oldest
pending age count pending rows, and a released row's wait counts from its due time.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from composition.conf import conf
from composition.outbox.models import OutboxMessage

__all__ = ["RELEASE_BATCH", "hold", "is_held", "release_due"]

# Rows released per statement (a sweep releases until none is due), and inserted per statement.
RELEASE_BATCH = 1000
HOLD_BATCH = 1000

# A held row with a key does not hold its key back while it waits; once due it goes before the
# key's rows still pending (its id is older), after any of them already in flight: a keyed row
# waits while a row of its key is in flight (leased): released then, it would be its key's head,
# sent beside that row. A relay's claim leases the key's head under a row lock and its lease shows
# only once it commits, so the release also waits while that head is locked (SKIP LOCKED: it tries
# again next sweep, never blocks), and reads the head's lease from its newest version (FOR SHARE
# follows an update committed after this statement began).
_RELEASE_SQL = """
UPDATE {table} t SET status = 'pending'
FROM (SELECT h.id FROM {table} h
      WHERE h.status = 'held' AND h.due_at <= statement_timestamp()
        AND (h.key IS NULL OR (
              NOT EXISTS (
                SELECT 1 FROM {table} p
                WHERE p.status = 'pending' AND p.key = h.key AND p.claimed_until >= statement_timestamp())
              AND NOT EXISTS (
                SELECT 1
                FROM (SELECT p.id FROM {table} p WHERE p.status = 'pending' AND p.key = h.key
                      ORDER BY p.id LIMIT 1) head
                LEFT JOIN LATERAL (
                  SELECT q.id, q.claimed_until FROM {table} q WHERE q.id = head.id AND q.status = 'pending'
                  FOR SHARE OF q SKIP LOCKED) free ON TRUE
                WHERE free.id IS NULL OR free.claimed_until >= statement_timestamp())))
      ORDER BY h.due_at
      LIMIT %(limit)s
      FOR UPDATE OF h SKIP LOCKED) due
WHERE t.id = due.id
RETURNING t.id
"""


def is_held(delay_s: float | None) -> bool:
    """Whether a publish delayed ``delay_s`` seconds waits in the outbox, held until due."""
    return delay_s is not None and delay_s > float(conf.OUTBOX_HELD_DELAY_S)


def hold(*, actor_name: str, queue_name: str, payloads: Sequence[Any], key: str | None, headers: dict[str, Any],
         delay_s: float, created_at: datetime) -> list[OutboxMessage]:
    """Write held rows, one per payload, in one statement; nothing is sent or nudged."""
    due_at = created_at + timedelta(seconds=delay_s)
    return OutboxMessage.objects.bulk_create([
        OutboxMessage(actor_name=actor_name, queue_name=queue_name, payload=payload, key=key, headers=headers,
                      delay_s=delay_s, status=OutboxMessage.Status.HELD, created_at=created_at, due_at=due_at)
        for payload in payloads], batch_size=HOLD_BATCH)


def release_due(limit: int = RELEASE_BATCH) -> int:
    """Make held rows that came due pending, the earliest first, until none is due; returns how
    many. Rows another relay is releasing meanwhile are skipped, not waited for."""
    table = connection.ops.quote_name(OutboxMessage._meta.db_table)
    released = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(_RELEASE_SQL.format(table=table), {"limit": limit})
            count = len(cursor.fetchall())
        released += count
        if count < limit:
            return released
