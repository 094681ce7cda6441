"""The statements on the outbox table: insert (claimed at once), claim, confirm, renew, mark sent,
release.

A row is claimable when it is pending, its lease is absent or expired, and it is the oldest
pending row of its key. ``SKIP LOCKED`` skips a locked head row, so a key's later rows are never
taken on their own: they ride along only in the batch of the relay that holds the key's head,
which enqueues them in order. Nothing keeps an id cursor (ids are allocated at insert, not at
commit), so a row that commits late is still found. A relay that crashes after claiming leaves
leased rows that are claimed again once the lease expires: at least once, never lost.

A publishing process that sends its rows itself right after COMMIT inserts them already leased
to its relay (``insert``), so no statement stands between COMMIT and the broker: a row is
inserted leased when no other pending row of its key is visible (rows the same transaction
inserted leased excepted). A row so inserted blocks the rest of its key as any claimed head
does, and a crash leaves it to the sweep once the lease expires. What the insert cannot see (an
older row of the key that a concurrent transaction commits before this one) ``confirm`` checks
after COMMIT, as the claim would.

Every statement here is one round trip. The relay's own bookkeeping (leases, sent marks) needs
no durability: if a server crash loses the last few such commits, the rows are simply claimed
and relayed again, which the relay's at-least-once contract (and the inbox ledger behind it)
already covers. So outside a caller's transaction each statement turns ``synchronous_commit``
off for its own implicit transaction (``set_config(..., true)`` inside the statement), and its
commit does not wait for the WAL flush; not waiting for two fsyncs per batch is most of the
relay's throughput on a real disk.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from dramatiq.message import Message

from composition.outbox.models import OutboxMessage, message_id_for

__all__ = ["CLAIM_SQL", "CONFIRM_SQL", "INSERT_SQL", "INSERT_UNLESS_KEY_PENDING_SQL", "MARK_SENT_SQL",
           "MARK_SENT_UNKEYED_SQL", "RELEASE_SQL", "RENEW_SQL", "ClaimedMessage", "Inserted", "claim", "confirm",
           "insert", "mark_sent", "release", "renew"]

# "{relax}" is what turns synchronous_commit off for a statement's own implicit transaction, or
# NULL inside a caller's transaction (whose commit it would cover); see the module doc.
# "{relax_condition}" does the same as a WHERE condition that always holds.
_RELAX = "set_config('synchronous_commit', 'off', true)"
_KEEP = "NULL"
_RELAX_CONDITION = f"{_RELAX} IS NOT NULL"
_KEEP_CONDITION = "TRUE"

# Every publish runs one of these, and the statement is planned anew each time (client-side
# binding): the plain VALUES form plans in a few tens of microseconds; only a row with a key pays
# for the look at its key's other pending rows.
INSERT_SQL = """
INSERT INTO {table} (actor_name, queue_name, payload, key, headers, delay_s, status, created_at,
                     claimed_until, claimed_by, attempts, sent_at, last_error)
VALUES (%(actor_name)s, %(queue_name)s, %(payload)s::jsonb, %(key)s, %(headers)s::jsonb, %(delay_s)s,
        'pending', %(created_at)s,
        CASE WHEN %(claim)s THEN statement_timestamp() + make_interval(secs => %(lease_s)s) END,
        %(relay_id)s, CASE WHEN %(claim)s THEN 1 ELSE 0 END, NULL, '')
RETURNING id, claimed_until
"""

INSERT_UNLESS_KEY_PENDING_SQL = """
INSERT INTO {table} (actor_name, queue_name, payload, key, headers, delay_s, status, created_at,
                     claimed_until, claimed_by, attempts, sent_at, last_error)
SELECT %(actor_name)s, %(queue_name)s, %(payload)s::jsonb, %(key)s, %(headers)s::jsonb, %(delay_s)s,
       'pending', %(created_at)s,
       CASE WHEN f.free THEN statement_timestamp() + make_interval(secs => %(lease_s)s) END,
       CASE WHEN f.free THEN %(relay_id)s ELSE '' END,
       CASE WHEN f.free THEN 1 ELSE 0 END,
       NULL, ''
FROM (SELECT NOT EXISTS (
        SELECT 1 FROM {table} p
        WHERE p.status = 'pending' AND p.key = %(key)s AND p.id <> ALL(%(own_ids)s::bigint[])) AS free) f
RETURNING id, claimed_until
"""

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
FROM picked, (SELECT {relax}) relax
WHERE t.id = picked.id AND t.status = 'pending'
RETURNING t.id, t.actor_name, t.queue_name, t.payload, t.key, t.headers, t.delay_s, t.created_at
"""

# After COMMIT, for rows ``insert`` leased to this relay: renew the lease of those it still holds
# and give back those that an older pending row of their key (one this insert could not see)
# now precedes; the rows of ``ids`` never block each other, they are one transaction's, in order.
CONFIRM_SQL = """
WITH own AS (
    SELECT o.id,
           o.key IS NOT NULL AND EXISTS (
               SELECT 1 FROM {table} p
               WHERE p.status = 'pending' AND p.key = o.key AND p.id < o.id
                 AND p.id <> ALL(%(ids)s::bigint[])) AS blocked
    FROM {table} o
    WHERE o.id = ANY(%(ids)s::bigint[]) AND o.status = 'pending' AND o.claimed_by = %(relay_id)s
)
UPDATE {table} t
SET claimed_until = CASE WHEN own.blocked THEN NULL ELSE now() + make_interval(secs => %(lease_s)s) END,
    attempts = CASE WHEN own.blocked THEN t.attempts - 1 ELSE t.attempts END
FROM own, (SELECT {relax}) relax
WHERE t.id = own.id AND t.status = 'pending' AND t.claimed_by = %(relay_id)s
RETURNING t.id, own.blocked
"""

# Only the claimant renews, marks or releases: a relay whose lease ran out and whose rows another
# relay claimed again leaves them to that relay (both sent them: at least once, never lost).
# A released row (claimed_until NULL, claimed_by still this relay's) is not renewed: a renewal
# racing the release of a failed batch must not lease the row again for a whole lease.
RENEW_SQL = """
UPDATE {table} t SET claimed_until = now() + make_interval(secs => %(lease_s)s)
FROM (SELECT {relax}) relax
WHERE t.id = ANY(%(ids)s::bigint[]) AND t.status = 'pending' AND t.claimed_by = %(relay_id)s
  AND t.claimed_until IS NOT NULL
RETURNING t.id
"""

# It also answers whether a pending row of a marked row's key waits behind it: that row's own
# send after COMMIT found the key's head still in flight and left it to the relay, whose claim
# may have come too early as well; whoever marks the head then wakes the relay for it.
MARK_SENT_SQL = """
WITH marked AS (
    UPDATE {table} t SET status = 'sent', sent_at = %(sent_at)s, claimed_until = NULL, last_error = ''
    FROM (SELECT {relax}) relax
    WHERE t.id = ANY(%(ids)s::bigint[]) AND t.status = 'pending' AND t.claimed_by = %(relay_id)s
    RETURNING t.id, t.key
)
SELECT EXISTS (
    SELECT 1 FROM marked m JOIN {table} p ON p.key = m.key
    WHERE p.status = 'pending' AND p.id > m.id AND p.id <> ALL(%(ids)s::bigint[]))
"""

# The same for rows without a key, which nothing can wait behind: one plain UPDATE, which
# PostgreSQL plans and runs in about half the time of the statement above (it is run after
# every publishing COMMIT).
MARK_SENT_UNKEYED_SQL = """
UPDATE {table} t SET status = 'sent', sent_at = %(sent_at)s, claimed_until = NULL, last_error = ''
WHERE t.id = ANY(%(ids)s::bigint[]) AND t.status = 'pending' AND t.claimed_by = %(relay_id)s
  AND {relax_condition}
"""

RELEASE_SQL = """
UPDATE {table} t SET claimed_until = NULL, last_error = %(error)s
FROM (SELECT {relax}) relax
WHERE t.id = ANY(%(ids)s::bigint[]) AND t.status = 'pending' AND t.claimed_by = %(relay_id)s
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


@dataclass(frozen=True)
class Inserted:
    """What ``insert`` wrote: the row's id and, when it was inserted leased, its lease's end."""

    id: int
    claimed_until: datetime | None


def _execute(template: str, params: dict[str, Any], *, returns_rows: bool = True) -> list[tuple[Any, ...]]:
    # One round trip: outside a transaction the statement is its own, and relaxes its commit.
    in_transaction = connection.in_atomic_block
    sql = template.format(table=_table(), relax=_KEEP if in_transaction else _RELAX,
                          relax_condition=_KEEP_CONDITION if in_transaction else _RELAX_CONDITION)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if returns_rows else []


def _id_array(ids: Sequence[int]) -> str:
    """``ids`` as a PostgreSQL array literal, for a ``::bigint[]`` parameter: binding a text value
    costs a fraction of adapting a Python list element by element, on every statement."""
    return "{" + ",".join(str(int(pk)) for pk in ids) + "}"


def _table() -> str:
    return connection.ops.quote_name(OutboxMessage._meta.db_table)


def _decode_json(value: Any) -> Any:
    # psycopg returns jsonb decoded; a raw cursor on another driver might hand back text.
    if isinstance(value, str | bytes):
        return json.loads(value)
    return value


def insert(*, actor_name: str, queue_name: str, payload_json: str, key: str | None, headers_json: str,
           delay_s: float | None, created_at: datetime, claim_for: str | None = None, lease_s: float = 0.0,
           own_ids: Sequence[int] = ()) -> Inserted:
    """Insert one pending row in the caller's transaction (``payload_json`` and ``headers_json``
    are JSON objects, as text). With ``claim_for`` (a relay id), the row is inserted leased to that
    relay for ``lease_s`` seconds, with one claim counted, unless another pending row of its key
    is visible; ``own_ids`` are the rows of its key this transaction inserted leased already,
    which do not count.
    """
    params = {"actor_name": actor_name, "queue_name": queue_name, "payload": payload_json, "key": key,
              "headers": headers_json, "delay_s": delay_s, "created_at": created_at,
              "claim": claim_for is not None, "relay_id": claim_for or "", "lease_s": lease_s}
    if claim_for is not None and key is not None:
        rows = _execute(INSERT_UNLESS_KEY_PENDING_SQL, {**params, "own_ids": _id_array(own_ids)})
    else:
        rows = _execute(INSERT_SQL, params)
    return Inserted(id=rows[0][0], claimed_until=rows[0][1])


def claim(*, limit: int, lease_s: float, relay_id: str,
          only_ids: Sequence[int] | None = None) -> list[ClaimedMessage]:
    """Lease up to ``limit`` claimable rows for ``lease_s`` seconds to ``relay_id`` (one short
    transaction, the only one that locks rows); oldest first.

    With ``only_ids``, only those rows can be a key's head (the rows a transaction just
    published); the rows of the same key that follow a claimed head ride along, whoever
    published them, so every key still leaves in publish order.
    """
    rows = _execute(CLAIM_SQL, {
        "limit": limit, "lease_s": lease_s, "relay_id": relay_id,
        "only_ids": _id_array(only_ids) if only_ids is not None else None})
    claimed = [ClaimedMessage(id=row[0], actor_name=row[1], queue_name=row[2], payload=_decode_json(row[3]),
                              key=row[4], headers=_decode_json(row[5]) or {}, delay_s=row[6], created_at=row[7])
               for row in rows]
    claimed.sort(key=lambda message: message.id)
    return claimed


def confirm(ids: Sequence[int], *, lease_s: float, relay_id: str) -> dict[int, bool]:
    """For rows ``ids`` that one transaction inserted leased to ``relay_id`` (``insert``), after
    its COMMIT: of those the relay still holds, row id -> whether it must wait (an older pending
    row of its key precedes it: its lease is dropped, so the relay takes it in order); the
    others have their lease renewed for ``lease_s`` seconds. Rows that do not exist (rolled back
    with a savepoint) or that the relay no longer holds are absent."""
    rows = _execute(CONFIRM_SQL, {"ids": _id_array(ids), "lease_s": lease_s, "relay_id": relay_id})
    return {row[0]: bool(row[1]) for row in rows}


def renew(ids: Sequence[int], *, lease_s: float, relay_id: str) -> set[int]:
    """Extend to ``lease_s`` seconds from now the lease of the rows ``ids`` that ``relay_id``
    still holds (pending, claimed by it); return their ids."""
    rows = _execute(RENEW_SQL, {"ids": _id_array(ids), "lease_s": lease_s, "relay_id": relay_id})
    return {row[0] for row in rows}


def mark_sent(ids: Sequence[int], *, sent_at: datetime, relay_id: str, keyed: bool = True) -> bool:
    """Mark the rows ``ids`` that ``relay_id`` still holds sent at ``sent_at`` and drop their lease;
    True when another pending row of one of their keys waits behind them. ``keyed=False`` says
    none of them has a key (then nothing can wait behind them, and nothing is looked for)."""
    params = {"ids": _id_array(ids), "sent_at": sent_at, "relay_id": relay_id}
    if not keyed:
        _execute(MARK_SENT_UNKEYED_SQL, params, returns_rows=False)
        return False
    rows = _execute(MARK_SENT_SQL, params)
    return bool(rows and rows[0][0])


def release(ids: Sequence[int], *, error: str, relay_id: str) -> None:
    """Give the rows ``ids`` that ``relay_id`` still holds back (lease dropped, ``error``
    recorded), so any relay claims them again at once."""
    _execute(RELEASE_SQL, {"ids": _id_array(ids), "error": error, "relay_id": relay_id}, returns_rows=False)
