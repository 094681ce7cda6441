"""Outbox maintenance: status, the pending gauges and pruning of sent rows (for the command,
the admin, the sweeper and retention)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from django.db.models import Count, Min, Q, QuerySet
from django.utils import timezone

from composition.conf import conf
from composition.metrics import OUTBOX_OLDEST_PENDING_AGE_SECONDS, OUTBOX_PENDING
from composition.outbox.models import OutboxMessage
from composition.pruning import delete_in_batches

__all__ = ["OutboxStatus", "outbox_status", "pending_summary", "prune_sent", "refresh_gauges",
           "sent_older_than"]


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


def sent_older_than(older_than_s: float) -> QuerySet[OutboxMessage]:
    """Sent rows whose ``sent_at`` is more than ``older_than_s`` seconds ago (never a pending row)."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    return OutboxMessage.objects.filter(status=OutboxMessage.Status.SENT, sent_at__lt=cutoff)


def prune_sent(older_than_s: float, *, batch_size: int | None = None, dry_run: bool = False) -> int:
    """Delete sent rows whose ``sent_at`` is older than ``older_than_s`` seconds, in batches of
    ``batch_size`` (default ``RETENTION_BATCH_SIZE``), each its own short transaction; returns
    how many were (or would be) deleted. Pending rows are never deleted."""
    size = int(conf.RETENTION_BATCH_SIZE) if batch_size is None else batch_size
    return delete_in_batches(sent_older_than(older_than_s), batch_size=size, dry_run=dry_run).deleted
