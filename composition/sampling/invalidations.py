"""Cache invalidations recorded and not yet applied, per cache alias: how many rows wait in
``PendingInvalidation`` and how old the oldest is. While one waits, processes other than its
writer may serve the value its write replaced (docs/cache_and_locks.md), so its age is that
staleness window, and one that grows means the replay is not running or not reaching Redis."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS, connections

__all__ = ["PendingInvalidations", "sample_pending_invalidations"]


@dataclass(frozen=True)
class PendingInvalidations:
    """``rows`` waiting for one cache alias; ``oldest_age_s``: how long the oldest has."""

    rows: int
    oldest_age_s: float


def sample_pending_invalidations(alias: str = DEFAULT_DB_ALIAS) -> dict[str, PendingInvalidations]:
    """Cache alias -> its pending invalidations, from one aggregate on the calling thread's
    connection to ``alias`` (the table holds only what is waiting: a few rows). Raises the
    database's errors."""
    from composition.cache.models import PendingInvalidation  # late: needs the app registry

    connection = connections[alias]
    table = connection.ops.quote_name(PendingInvalidation._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT alias, count(*), extract(epoch FROM now() - min(created_at)) FROM {table} "
                       "GROUP BY alias")
        return {str(cache): PendingInvalidations(int(rows), max(0.0, float(age)))
                for cache, rows, age in cursor.fetchall()}
