"""``publish_many()``: ``publish()`` for many payloads of one job, as ``bulk_create`` is ``save()``
for many rows: every payload checked before anything is written, one INSERT per
``ROWS_PER_INSERT`` payloads, and all of them sent in the transaction's one send after COMMIT.

What a changer must keep: the rows are inserted leased only when no other pending row of their key
is visible (this transaction's leased rows excepted), as ``claims.insert`` decides for ``publish()``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, transaction
from django.utils import timezone
from dramatiq.actor import Actor

from composition.outbox.after_commit import (
    SendAfterCommit,
    committing_transaction,
    nudge_after_commit,
    send_after_commit,
    under_savepoint,
)
from composition.outbox.claims import ClaimedMessage, Inserted
from composition.outbox.errors import PayloadNotSerializableError, PublishError
from composition.outbox.held import hold, is_held
from composition.outbox.models import OutboxMessage
from composition.outbox.payload_json import storable_json
from composition.outbox.publish import (
    LEFT_TO_THE_RELAY,
    checked_delay,
    checked_key,
    declared_actor,
    expiry_header,
    fitting_payload,
    priority_header,
    publish_headers,
    read_back,
    version_header,
)

__all__ = ["INSERT_MANY_SQL", "ROWS_PER_INSERT", "publish_many"]

# Payloads per INSERT: bounds one statement's size (up to OUTBOX_MAX_PAYLOAD_BYTES a payload, so
# 8 MiB at the default). Not PostgreSQL's 65,535 bind parameters: the payloads are one parameter.
ROWS_PER_INSERT = 1000

# Not bulk_create: it cannot return the lease end PostgreSQL's clock set, nor look at the key's
# pending rows in the same statement, and took 57 ms for 1,000 rows against 16 ms for this one.
# INSERT_UNLESS_KEY_PENDING_SQL (composition.outbox.claim_sql) for a whole array of payloads: one
# look at the key's pending rows decides for all of them. ORDER BY the payloads' place, so the
# ids (taken in the order rows are inserted) follow the caller's list.
INSERT_MANY_SQL = """
INSERT INTO {table} (actor_name, queue_name, payload, key, headers, delay_s, status, created_at,
                     claimed_until, claimed_by, attempts, sent_at, last_error)
SELECT %(actor_name)s, %(queue_name)s, u.payload::jsonb, %(key)s::text, %(headers)s::jsonb,
       %(delay_s)s::double precision, 'pending', %(created_at)s::timestamptz,
       CASE WHEN f.free THEN statement_timestamp() + make_interval(secs => %(lease_s)s) END,
       CASE WHEN f.free THEN %(relay_id)s ELSE '' END,
       CASE WHEN f.free THEN 1 ELSE 0 END,
       NULL, ''
FROM unnest(%(payloads)s::text[]) WITH ORDINALITY AS u(payload, place),
     (SELECT %(claim)s AND NOT EXISTS (
        SELECT 1 FROM {table} p
        WHERE p.status = 'pending' AND p.key = %(key)s::text
          AND p.id <> ALL(%(own_ids)s::bigint[])) AS free) f
ORDER BY u.place
RETURNING id, claimed_until
"""


def publish_many(actor: Any, payloads: Iterable[Mapping[str, Any]], *, key: str | None = None,
                 delay_s: float | None = None, priority: int = 0,
                 expires_s: float | None = None) -> list[OutboxMessage]:
    """Write one outbox message for ``actor`` per payload of ``payloads``, in list order, as
    ``publish()`` would one after the other in the same transaction: they commit or roll back with
    the caller's data, all of them are sent in the transaction's one send after COMMIT (at once in
    autocommit), and with a ``key`` they are relayed in list order, after the key's older rows.

    Every payload is checked as ``publish()`` checks it before anything is written: a bad one
    raises ``publish()``'s error, its message starting with ``payloads[<index>]:``, and nothing is
    written. ``actor``, ``key``, ``delay_s``, ``priority`` and ``expires_s`` are checked even when
    ``payloads`` is empty; then nothing is written and ``[]`` is returned.

    Returns the rows as inserted (pending, as ``publish()``'s), in the order of ``payloads``.
    """
    declared = declared_actor(actor)
    key = checked_key(key)
    delay_s = checked_delay(delay_s)
    options_headers = {**priority_header(priority), **expiry_header(expires_s, delay_s)}
    if not isinstance(payloads, Iterable) or isinstance(payloads, Mapping | str | bytes):
        raise PayloadNotSerializableError(f"payloads must be a list of payload dicts, got {type(payloads).__name__}")
    listed = list(payloads)
    encoded = [_fitting(declared, index, payload) for index, payload in enumerate(listed)]
    in_transaction = committing_transaction("publish_many()")
    if not listed:
        return []
    headers = publish_headers({**version_header(declared, {}), **options_headers})
    headers_json = storable_json(headers, "headers").decode()
    created_at = timezone.now()
    if is_held(delay_s):
        assert delay_s is not None
        return hold(actor_name=declared.actor_name, queue_name=declared.queue_name,
                    payloads=[json.loads(payload_json) for payload_json in encoded], key=key,
                    headers=json.loads(headers_json), delay_s=delay_s, created_at=created_at)
    send: SendAfterCommit | None = None
    claim_for: str | None = None
    lease_s = 0.0
    if not LEFT_TO_THE_RELAY.is_set():
        send, relay = send_after_commit(in_transaction)
        claim_for = relay.relay_id if send.relay is relay else None
        lease_s = relay.lease_s
    since = time.monotonic()
    savepoint = under_savepoint()

    rows: list[OutboxMessage] = []
    # Its own transaction in autocommit, as bulk_create's: a failed INSERT leaves none of the rows.
    with transaction.atomic(using=DEFAULT_DB_ALIAS, savepoint=False):
        for start in range(0, len(listed), ROWS_PER_INSERT):
            chunk, chunk_json = listed[start:start + ROWS_PER_INSERT], encoded[start:start + ROWS_PER_INSERT]
            inserted = _insert(chunk_json, actor_name=declared.actor_name, queue_name=declared.queue_name, key=key,
                               headers_json=headers_json, delay_s=delay_s, created_at=created_at,
                               claim_for=claim_for, lease_s=lease_s,
                               own_ids=send.claimed_by_key.get(key, []) if send and key is not None else [])
            for row, payload, payload_json in zip(inserted, chunk, chunk_json, strict=True):
                leased = row.claimed_until is not None
                if send is not None:
                    send.ids.append(row.id)
                    if leased:
                        # Decoded again: the caller may change its payloads before COMMIT, the rows cannot.
                        send.add_claimed(ClaimedMessage(
                            id=row.id, actor_name=declared.actor_name, queue_name=declared.queue_name,
                            payload=json.loads(payload_json), key=key, headers=json.loads(headers_json),
                            delay_s=delay_s, created_at=created_at,
                        ), since=since, under_savepoint=savepoint)
                rows.append(read_back(row, declared.actor_name, declared.queue_name, payload, key, dict(headers),
                                      delay_s, created_at, claim_for if leased else ""))
        if send is None:
            nudge_after_commit()  # left to the relay (composition.testing.left_to_the_relay)
    if send is not None and not in_transaction:
        send()  # autocommit: the rows are committed already
    return rows


def _fitting(declared: Actor[..., Any], index: int, payload: Any) -> bytes:
    try:
        return fitting_payload(declared, payload)
    except PublishError as exc:
        # publish()'s own error, naming the payload: its place is all the caller can find it by.
        exc.args = (f"payloads[{index}]: {exc}",)
        raise


def _insert(payloads_json: Sequence[bytes], *, actor_name: str, queue_name: str, key: str | None,
            headers_json: str, delay_s: float | None, created_at: datetime, claim_for: str | None,
            lease_s: float, own_ids: Sequence[int]) -> list[Inserted]:
    """Insert one pending row per payload (JSON objects, encoded) in the caller's transaction, leased
    to ``claim_for`` as ``claims.insert`` leases one; the rows in the payloads' order."""
    sql = INSERT_MANY_SQL.format(table=connection.ops.quote_name(OutboxMessage._meta.db_table))
    with connection.cursor() as cursor:
        cursor.execute(sql, {
            "actor_name": actor_name, "queue_name": queue_name, "key": key, "headers": headers_json,
            "delay_s": delay_s, "created_at": created_at, "claim": claim_for is not None,
            "relay_id": claim_for or "", "lease_s": lease_s, "own_ids": list(own_ids),
            "payloads": [payload.decode() for payload in payloads_json]})
        return [Inserted(id=pk, claimed_until=claimed_until) for pk, claimed_until in sorted(cursor.fetchall())]
