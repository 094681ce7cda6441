"""Cancelling a published job that no relay has sent: its outbox row goes, in the caller's
transaction, as ``publish()``'s row came.

The one rule: a row under a relay's lease is never taken, since that relay may be handing it to
the broker now; the DELETE waits for a claim under way to commit and then sees its lease. A job
on the broker already is not cancelled (a delay up to ``OUTBOX_HELD_DELAY_S`` waits there).
"""

from __future__ import annotations

import structlog
from django.db import connection

from composition.outbox.models import OutboxMessage

__all__ = ["cancel"]

log = structlog.get_logger("composition.outbox.cancel")

_CANCEL_SQL = """
DELETE FROM {table}
WHERE id = %(id)s AND status IN ('pending', 'held')
  AND (claimed_until IS NULL OR claimed_until < statement_timestamp())
RETURNING actor_name, queue_name, status
"""


def cancel(message: OutboxMessage | int) -> bool:
    """Cancel the job ``publish()`` wrote as ``message`` (the row it returned, or its id).

    True when the job will not run: its row was pending or held and no relay was sending it, and
    it is deleted now (inside ``transaction.atomic()``, once that commits; a rollback keeps it).
    False when it was sent already, a relay is sending it (a publish's own send after COMMIT
    holds the row, from the publish on: so too in the transaction that published it), or there
    is no such row (cancelled before, or sent and pruned). Raises ``TypeError`` for anything but
    a row or an id.
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
    log.info("outbox job cancelled", outbox_id=pk, actor=row[0], queue=row[1], was=row[2])
    return True
