"""The inbox ledger: a message id's database effects commit at most once.

``record_processed(message_id, actor)`` inserts the ledger row in the caller's transaction and
answers False when the id is already there; a concurrent redelivery waits on the unique index until
the first transaction ends. A replayed dead letter is keyed by the original message's id
(``ledger_key``), so the replay and a late redelivery of the original cannot both commit effects.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from dramatiq.broker import MessageProxy

from composition.outbox.publish import IDEMPOTENCY_KEY_HEADER

__all__ = ["ledger_key", "ledger_key_of", "record_processed"]



def ledger_key(message: MessageProxy) -> str:
    """The id under which ``message``'s effects are recorded: its idempotency key, else its id."""
    return ledger_key_of(message.options.get("composition"), str(message.message_id))


def ledger_key_of(headers: Any, message_id: str) -> str:
    """``ledger_key`` of a message with these ``options["composition"]`` headers and this id
    (an outbox row's headers and ``message_id_for`` its id, before it is a message)."""
    if isinstance(headers, dict):
        key = headers.get(IDEMPOTENCY_KEY_HEADER)
        if isinstance(key, str) and key:
            return key
    return message_id


@cache
def _insert_sql() -> str:
    # Imported here: composition.jobs (hence this module) may be imported before Django's apps are.
    from composition.jobs.models import ProcessedMessage

    table = connections[DEFAULT_DB_ALIAS].ops.quote_name(ProcessedMessage._meta.db_table)
    # ON CONFLICT DO NOTHING instead of catching IntegrityError: a failed INSERT would abort the
    # caller's transaction (PostgreSQL) unless wrapped in a savepoint.
    return (f"INSERT INTO {table} (message_id, actor, processed_at) VALUES (%s, %s, now())"
            " ON CONFLICT (message_id) DO NOTHING")


def record_processed(message_id: str, actor: str) -> bool:
    """Insert the ledger row for ``message_id`` (a ``ledger_key``); False when it was processed
    already.

    Must run inside ``transaction.atomic()`` together with the job's effects. Database errors are
    Django's (``django.db.OperationalError`` for a statement timeout, and so on).
    """
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute(_insert_sql(), [message_id, actor])
        return bool(cursor.rowcount == 1)
