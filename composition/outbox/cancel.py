"""Cancelling a published job that no relay has tried to send: its outbox row goes, in the
caller's transaction, as ``publish()``'s row came.

The one rule: a row a relay ever claimed (``attempts`` above 0) is never taken, even once its
lease ran out or a failed send released it: its message may be on the broker already (a relay
killed after its enqueue, a batch half sent). A DELETE that meets a claim under way waits for it
and then sees its count. A replay's row, cancelled, opens its dead letter again.
"""

from __future__ import annotations

import json
from typing import Any

import structlog
from django.apps import apps
from django.db import connection

from composition.outbox.models import OutboxMessage
from composition.outbox.publish import IDEMPOTENCY_KEY_HEADER

__all__ = ["cancel"]

log = structlog.get_logger("composition.outbox.cancel")

_CANCEL_SQL = """
DELETE FROM {table}
WHERE id = %(id)s AND status IN ('pending', 'held') AND attempts = 0
RETURNING actor_name, queue_name, status, headers
"""


def cancel(message: OutboxMessage | int) -> bool:
    """Cancel the job ``publish()`` wrote as ``message`` (the row it returned, or its id).

    True when the job will not run: its row was pending or held and no relay had claimed it, and
    it is deleted now (inside ``transaction.atomic()``, once that commits; a rollback keeps it).
    False when a relay claimed it (sent, being sent, or tried: it may be on the broker; a
    publish's own send after COMMIT claims the row at the publish, so in its transaction too), or
    when there is no such row (cancelled before, purged, or sent and pruned). Raises
    ``TypeError`` for anything but a row or an id.
    """
    if isinstance(message, OutboxMessage):
        pk = message.pk
    elif isinstance(message, int) and not isinstance(message, bool):
        pk = message
    else:
        raise TypeError(f"cancel() takes an outbox row or its id, not {type(message).__name__}")
    if pk is None:
        raise TypeError("cancel() takes a row publish() wrote; this one has no id")
    table = connection.ops.quote_name(OutboxMessage._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(_CANCEL_SQL.format(table=table), {"id": pk})
        row = cursor.fetchone()
    if row is None:
        return False
    actor, queue, status, headers = row
    reopened = _reopen_replayed(pk, headers)
    log.info("outbox job cancelled", outbox_id=pk, actor=actor, queue=queue, was=status,
             dead_letters_reopened=reopened)
    return True


def _reopen_replayed(pk: int, headers: Any) -> int:
    """Open again the dead letter whose replay wrote row ``pk``, so the job is not lost; how many
    (0 or 1). Only a replay's row carries the idempotency key header, so no other cancel looks."""
    if isinstance(headers, str):  # jsonb comes as text through Django's connection
        headers = json.loads(headers)
    if not (isinstance(headers, dict) and headers.get(IDEMPOTENCY_KEY_HEADER)):
        return 0
    # By name: composition.jobs imports the outbox, not the other way round.
    dead_letters = apps.get_model("composition", "DeadLetter")
    return int(dead_letters.objects.filter(replay_outbox_id=pk, status="replayed").update(
        status="dead", replayed_at=None, replayed_by=None, replay_outbox_id=None))
