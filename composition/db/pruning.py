"""Deleting old rows in small batches, each batch its own short transaction.

A batch is one statement, ``DELETE ... WHERE id IN (SELECT id ... ORDER BY id LIMIT n FOR UPDATE
SKIP LOCKED)``: no statement holds row locks or WAL for long, and a row that someone else has
locked (a dead letter being replayed, say) is skipped instead of waited for; it goes next time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from django.db import connections, transaction
from django.db.models import QuerySet

from composition.metrics import RETENTION_PRUNED_TOTAL

__all__ = ["PruneResult", "delete_in_batches"]


@dataclass(frozen=True)
class PruneResult:
    """What one prune of one table did. ``batches`` counts the DELETE statements issued (0 for a
    dry run, whose ``deleted`` is the number of rows that would go)."""

    table: str
    deleted: int
    batches: int
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def delete_in_batches(rows: QuerySet[Any], *, batch_size: int, dry_run: bool = False,
                      should_stop: Callable[[], bool] | None = None) -> PruneResult:
    """Delete every row of ``rows``, ``batch_size`` rows (lowest ids first) per transaction.

    Stops after a batch that deletes fewer than ``batch_size`` rows (nothing left, or only rows
    locked by someone else), or before the next batch once ``should_stop()`` is true. Deleted
    rows are counted in ``composition_retention_pruned_total{table}``. Raises ValueError when
    ``batch_size`` is below 1. The model must have no dependants that Django would cascade to:
    the statement is raw SQL, so no signals fire and no ``on_delete`` runs.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size!r}")
    model = rows.model
    table = model._meta.db_table
    if dry_run:
        return PruneResult(table=table, deleted=rows.count(), batches=0, dry_run=True)
    connection = connections[rows.db]
    quoted_table = connection.ops.quote_name(table)
    quoted_pk = connection.ops.quote_name(model._meta.pk.column)
    deleted = batches = 0
    while should_stop is None or not should_stop():
        # The ids are chosen by the ORM (so callers filter with querysets) and deleted by one raw
        # statement: QuerySet.delete() would fetch the ids first and send them back, two round
        # trips and a lock held in between.
        with transaction.atomic(using=rows.db):
            ids = rows.order_by("pk").values("pk").select_for_update(skip_locked=True)[:batch_size]
            select_sql, params = ids.query.get_compiler(using=rows.db).as_sql()
            with connection.cursor() as cursor:
                cursor.execute(f"DELETE FROM {quoted_table} WHERE {quoted_pk} IN ({select_sql})", params)
                count = max(cursor.rowcount, 0)
        batches += 1
        deleted += count
        if count:
            RETENTION_PRUNED_TOTAL.labels(table).inc(count)
        if count < batch_size:
            break
    return PruneResult(table=table, deleted=deleted, batches=batches)
