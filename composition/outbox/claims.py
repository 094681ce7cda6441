"""The statements on the outbox table: insert (claimed at once), claim, confirm, renew, mark sent, release.

A row is claimable when it is pending, its lease absent or expired, and it is the oldest pending
row of its key, so a key's rows go out in order; no id cursor is kept, so a row that commits late is
still found, and a crashed relay's rows are claimed again once their lease expires. ``insert``
leases a row at once when no older row of its key is visible; ``confirm`` checks after COMMIT what
it could not see. Outside a caller's transaction each statement turns ``synchronous_commit`` off:
a lease or sent mark lost in a crash only relays a row again (at least once, never lost).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from dramatiq.message import Message

from composition.broker.priorities import PRIORITY_HEADER, PRIORITY_OPTION, message_priority
from composition.db.jsonb import decoded
from composition.outbox.claim_sql import (
    CLAIM_SQL,
    CONFIRM_SQL,
    INSERT_SQL,
    INSERT_UNLESS_KEY_PENDING_SQL,
    KEEP,
    KEEP_CONDITION,
    MARK_SENT_SQL,
    MARK_SENT_UNKEYED_SQL,
    MOVE_SQL,
    RELAX,
    RELAX_CONDITION,
    RELEASE_SQL,
    RENEW_SQL,
)
from composition.outbox.models import OutboxMessage, message_id_for

__all__ = ["CLAIM_SQL", "CONFIRM_SQL", "INSERT_SQL", "INSERT_UNLESS_KEY_PENDING_SQL", "MARK_SENT_SQL",
           "MARK_SENT_UNKEYED_SQL", "MOVE_SQL", "RELEASE_SQL", "RENEW_SQL", "ClaimedMessage", "Inserted", "claim",
           "confirm", "insert", "mark_sent", "move_to_queue", "release", "renew"]


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
    due_at: datetime | None = None  # a held row's (composition.outbox.held)

    def to_message(self, now_s: float) -> tuple[Message[Any], int | None]:
        """The Dramatiq message (args=(), kwargs=payload) and its delay in ms (None: due now)."""
        delay_ms = None
        if self.delay_s:
            due_s = self.due_at.timestamp() if self.due_at is not None else self.created_at.timestamp() + self.delay_s
            remaining_s = due_s - now_s
            if remaining_s > 0:
                # A message's eta is whole milliseconds added to a floored clock (Dramatiq's
                # current_millis), and it starts once that clock reaches the eta: rounding up and
                # one millisecond more keep a start from falling before the time it is due.
                delay_ms = math.ceil(remaining_s * 1000) + 1
        headers = {**self.headers, "outbox_id": self.id, "key": self.key}
        options: dict[str, Any] = {"composition": headers}
        priority = message_priority({PRIORITY_OPTION: headers.get(PRIORITY_HEADER)})
        if priority:
            options[PRIORITY_OPTION] = priority
        message: Message[Any] = Message(
            queue_name=self.queue_name, actor_name=self.actor_name, args=(), kwargs=self.payload,
            options=options, message_id=message_id_for(self.id), message_timestamp=int(now_s * 1000),
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
    sql = template.format(table=_table(), relax=KEEP if in_transaction else RELAX,
                          relax_condition=KEEP_CONDITION if in_transaction else RELAX_CONDITION)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if returns_rows else []


def _id_array(ids: Sequence[int]) -> str:
    """``ids`` as a PostgreSQL array literal, for a ``::bigint[]`` parameter: binding a text value
    costs a fraction of adapting a Python list element by element, on every statement."""
    return "{" + ",".join(str(int(pk)) for pk in ids) + "}"


def _table() -> str:
    return connection.ops.quote_name(OutboxMessage._meta.db_table)


def _insert_params(actor_name: str, queue_name: str, payload_json: str, key: str | None, headers_json: str,
                   delay_s: float | None, created_at: datetime, claim_for: str | None,
                   lease_s: float) -> dict[str, Any]:
    return {"actor_name": actor_name, "queue_name": queue_name, "payload": payload_json, "key": key,
            "headers": headers_json, "delay_s": delay_s, "created_at": created_at,
            "claim": claim_for is not None, "relay_id": claim_for or "", "lease_s": lease_s}


def insert(*, actor_name: str, queue_name: str, payload_json: str, key: str | None, headers_json: str,
           delay_s: float | None, created_at: datetime, claim_for: str | None = None, lease_s: float = 0.0,
           own_ids: Sequence[int] = ()) -> Inserted:
    """Insert one pending row in the caller's transaction (``payload_json`` and ``headers_json``
    are JSON objects, as text). With ``claim_for`` (a relay id), the row is inserted leased to that
    relay for ``lease_s`` seconds, with one claim counted, unless another pending row of its key
    is visible; ``own_ids`` are the rows of its key this transaction inserted leased already,
    which do not count.
    """
    params = _insert_params(actor_name, queue_name, payload_json, key, headers_json, delay_s, created_at,
                            claim_for, lease_s)
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
    claimed = [ClaimedMessage(id=row[0], actor_name=row[1], queue_name=row[2], payload=decoded(row[3]),
                              key=row[4], headers=decoded(row[5]) or {}, delay_s=row[6], created_at=row[7],
                              due_at=row[8])
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


def move_to_queue(ids: Sequence[int], queue_name: str, *, relay_id: str) -> None:
    """Record that the rows ``ids`` that ``relay_id`` still holds go to ``queue_name``, their
    job's queue now (a deploy moved the job since they were written)."""
    _execute(MOVE_SQL, {"ids": _id_array(ids), "queue_name": queue_name, "relay_id": relay_id}, returns_rows=False)
