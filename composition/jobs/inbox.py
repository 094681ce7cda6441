"""The inbox ledger: a message id's database effects commit at most once.

``claim(message_id, actor)`` inserts the ledger row inside the caller's transaction; it answers
False when the id is already there. A concurrent redelivery of the same message waits on the
unique index until the first transaction ends, then sees the row (committed: skip) or takes
over (rolled back: run), so two deliveries never both commit effects.
"""

from __future__ import annotations

from django.db import connection

__all__ = ["claim"]


def claim(message_id: str, actor: str) -> bool:
    """Insert the ledger row for ``message_id``; False when it was processed already.

    Must run inside ``transaction.atomic()`` together with the job's effects.
    """
    from composition.jobs.models import ProcessedMessage

    table = connection.ops.quote_name(ProcessedMessage._meta.db_table)
    with connection.cursor() as cursor:
        # ON CONFLICT DO NOTHING instead of catching IntegrityError: a failed INSERT would abort
        # the caller's transaction (PostgreSQL) unless wrapped in a savepoint.
        cursor.execute(
            f"INSERT INTO {table} (message_id, actor, processed_at) VALUES (%s, %s, now())"
            " ON CONFLICT (message_id) DO NOTHING RETURNING id",
            [message_id, actor],
        )
        return cursor.fetchone() is not None
