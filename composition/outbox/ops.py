"""Operator views of the outbox: status, gauges and pruning (used by the command and admin)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from django.db import connection
from django.db.models import Count, Min, Q
from django.utils import timezone

from composition.metrics import OUTBOX_OLDEST_PENDING_AGE_SECONDS, OUTBOX_PENDING
from composition.outbox.models import OutboxMessage

__all__ = ["OutboxStatus", "outbox_status", "pending_summary", "prune_sent", "refresh_gauges"]

# Rows deleted per statement when pruning: big enough to be quick, small enough that no single
# DELETE holds locks or WAL for long.
PRUNE_BATCH_SIZE = 2000


@dataclass(frozen=True)
class OutboxStatus:
    pending: int
    leased: int
    sent: int
    oldest_pending_age_s: float
    pending_by_actor: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def pending_summary() -> tuple[int, float]:
    """(pending count, age in seconds of the oldest pending message, 0.0 when none)."""
    row = OutboxMessage.objects.filter(status=OutboxMessage.Status.PENDING).aggregate(
        count=Count("id"), oldest=Min("created_at"))
    oldest = row["oldest"]
    age_s = max(0.0, (timezone.now() - oldest).total_seconds()) if oldest is not None else 0.0
    return int(row["count"]), age_s


def refresh_gauges() -> tuple[int, float]:
    """Sample the pending gauges; returns what ``pending_summary`` returned."""
    pending, age_s = pending_summary()
    OUTBOX_PENDING.set(pending)
    OUTBOX_OLDEST_PENDING_AGE_SECONDS.set(age_s)
    return pending, age_s


def outbox_status() -> OutboxStatus:
    """Counts by state and the pending backlog by actor (also refreshes the gauges)."""
    pending, age_s = refresh_gauges()
    now = timezone.now()
    counts = OutboxMessage.objects.aggregate(
        leased=Count("id", filter=Q(status=OutboxMessage.Status.PENDING, claimed_until__gt=now)),
        sent=Count("id", filter=Q(status=OutboxMessage.Status.SENT)),
    )
    by_actor = dict(OutboxMessage.objects.filter(status=OutboxMessage.Status.PENDING)
                    .values_list("actor_name").annotate(n=Count("id")).order_by("actor_name"))
    return OutboxStatus(pending=pending, leased=int(counts["leased"]), sent=int(counts["sent"]),
                        oldest_pending_age_s=round(age_s, 3), pending_by_actor=by_actor)


def prune_sent(older_than_s: float, *, batch_size: int = PRUNE_BATCH_SIZE, dry_run: bool = False) -> int:
    """Delete sent rows whose ``sent_at`` is older than ``older_than_s`` seconds, in batches of
    ``batch_size`` (each its own short transaction); returns how many were (or would be) deleted.
    Pending rows are never deleted."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    old_sent = OutboxMessage.objects.filter(status=OutboxMessage.Status.SENT, sent_at__lt=cutoff)
    if dry_run:
        return old_sent.count()
    table = connection.ops.quote_name(OutboxMessage._meta.db_table)
    sql = (f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE status = 'sent' "
           "AND sent_at < %s LIMIT %s)")
    total = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(sql, [cutoff, batch_size])
            deleted = cursor.rowcount
        total += deleted
        if deleted < batch_size:
            return total
