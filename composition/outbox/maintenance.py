"""Outbox maintenance: status, the pending gauges and pruning of sent rows (for the command,
the admin, the operations page, the sweeper and retention).

The backlog is counted by one function, ``backlog_by_queue``: ``outbox status`` reports it per
queue and its totals (pending rows, the oldest one's age), and the operations page shows the
same rows and the same totals (``backlog_totals``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, DateTimeField, ExpressionWrapper, F, Func, Min, Q, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone

from composition.conf import conf
from composition.db.pruning import delete_in_batches
from composition.metrics import OUTBOX_OLDEST_PENDING_AGE_SECONDS, OUTBOX_PENDING
from composition.outbox.models import OutboxMessage

__all__ = ["RELAYED_WINDOW_S", "OutboxStatus", "QueueBacklog", "backlog_by_queue", "backlog_totals", "outbox_status",
           "pending_summary", "prune_sent", "refresh_gauges", "sent_older_than"]

# The default window of ``relayed_recently``: the operations page's rate window (the workers'
# heartbeats count their runs over the same five minutes).
RELAYED_WINDOW_S = 300.0


@dataclass(frozen=True)
class QueueBacklog:
    """One queue's outbox side: rows not yet relayed, the age of the oldest (None when none is:
    an empty queue's "0.0 s" read as if a row had just arrived), and rows relayed within the
    last ``window_s`` seconds."""

    pending: int
    oldest_pending_age_s: float | None
    relayed_recently: int


@dataclass(frozen=True)
class OutboxStatus:
    pending: int
    leased: int
    sent: int
    oldest_pending_age_s: float | None  # None when nothing is pending
    pending_by_actor: dict[str, int]
    # Held until due (composition.outbox.held): no backlog, counted apart; the next one due in
    # this many seconds (None when none is held).
    held: int = 0
    next_due_in_s: float | None = None
    # backlog_by_queue(window_s), what the operations page shows per queue.
    queues: dict[str, QueueBacklog] = field(default_factory=dict)
    window_s: float = RELAYED_WINDOW_S

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pending_by_queue() -> dict[str, tuple[int, datetime]]:
    """Per queue, (pending rows, since when the oldest waits): one aggregate through the pending
    partial index, as small as the backlog. A released held row waits from its due time."""
    return {row["queue_name"]: (int(row["count"]), row["oldest"])
            for row in OutboxMessage.objects.filter(status=OutboxMessage.Status.PENDING)
            .values("queue_name").annotate(count=Count("id"), oldest=Min(Coalesce("due_at", "created_at")))
            .order_by()}


def _age_s(now: datetime, then: datetime) -> float:
    return max(0.0, (now - then).total_seconds())


def backlog_totals(backlog: Mapping[str, QueueBacklog]) -> tuple[int, float | None]:
    """(pending rows, age in seconds of the oldest, None when none) over every queue of ``backlog``."""
    return (sum(queue.pending for queue in backlog.values()),
            max((queue.oldest_pending_age_s for queue in backlog.values() if queue.oldest_pending_age_s is not None),
                default=None))


def backlog_by_queue(window_s: float = RELAYED_WINDOW_S) -> dict[str, QueueBacklog]:
    """Per queue, two queries in all: the pending rows (through the pending partial index, as
    small as the backlog) and the rows sent within ``window_s`` (through the sent_at partial
    index, as small as the window)."""
    now = timezone.now()
    pending = _pending_by_queue()
    relayed = dict(OutboxMessage.objects.filter(status=OutboxMessage.Status.SENT,
                                                sent_at__gte=now - timedelta(seconds=window_s))
                   .values_list("queue_name").annotate(n=Count("id")).order_by())
    return {queue: QueueBacklog(
        pending=pending[queue][0] if queue in pending else 0,
        oldest_pending_age_s=_age_s(now, pending[queue][1]) if queue in pending else None,
        relayed_recently=int(relayed.get(queue, 0)))
        for queue in sorted(set(pending) | set(relayed))}


def pending_summary() -> tuple[int, float]:
    """(pending count, age in seconds of the oldest pending message, 0.0 when none): the pending
    half of ``backlog_by_queue``, totalled (one query)."""
    by_queue = list(_pending_by_queue().values())
    oldest = min((created for _, created in by_queue), default=None)
    return sum(count for count, _ in by_queue), _age_s(timezone.now(), oldest) if oldest is not None else 0.0


def _set_gauges(pending: int, age_s: float) -> None:
    OUTBOX_PENDING.set(pending)
    OUTBOX_OLDEST_PENDING_AGE_SECONDS.set(age_s)


def refresh_gauges() -> tuple[int, float]:
    """Sample the pending gauges; returns what ``pending_summary`` returned."""
    pending, age_s = pending_summary()
    _set_gauges(pending, age_s)
    return pending, age_s


def outbox_status(*, window_s: float = RELAYED_WINDOW_S) -> OutboxStatus:
    """Counts by state, the pending backlog by actor and ``backlog_by_queue(window_s)``, whose
    totals are the pending count and the oldest age (also refreshes the gauges)."""
    queues = backlog_by_queue(window_s)
    pending, age_s = backlog_totals(queues)
    _set_gauges(pending, age_s or 0.0)  # the gauge reads 0 when none, for the alerts' arithmetic
    now = timezone.now()
    counts = OutboxMessage.objects.aggregate(
        leased=Count("id", filter=Q(status=OutboxMessage.Status.PENDING, claimed_until__gt=now)),
        sent=Count("id", filter=Q(status=OutboxMessage.Status.SENT)),
    )
    held = OutboxMessage.objects.filter(status=OutboxMessage.Status.HELD).aggregate(n=Count("id"), next=Min("due_at"))
    by_actor = dict(OutboxMessage.objects.filter(status=OutboxMessage.Status.PENDING)
                    .values_list("actor_name").annotate(n=Count("id")).order_by("actor_name"))
    return OutboxStatus(pending=pending, leased=int(counts["leased"]), sent=int(counts["sent"]),
                        oldest_pending_age_s=_rounded(age_s), pending_by_actor=by_actor, held=int(held["n"]),
                        next_due_in_s=None if held["next"] is None else round((held["next"] - now).total_seconds(), 3),
                        queues={name: replace(queue, oldest_pending_age_s=_rounded(queue.oldest_pending_age_s))
                                for name, queue in queues.items()}, window_s=window_s)


def _rounded(age_s: float | None) -> float | None:
    return None if age_s is None else round(age_s, 3)


def sent_older_than(older_than_s: float) -> QuerySet[OutboxMessage]:
    """Sent rows whose ``sent_at`` is more than ``older_than_s`` seconds ago (never a pending row),
    and, for a delayed message, whose time to run (``created_at`` + ``delay_s``) is too: a task
    deferred beyond the retention is sent at once, and its row is how ``get_result`` finds it
    until it runs."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    due = ExpressionWrapper(F("created_at") + Func(F("delay_s"), template="make_interval(secs => %(expressions)s)"),
                            output_field=DateTimeField())
    return OutboxMessage.objects.alias(due=due).filter(Q(delay_s__isnull=True) | Q(due__lt=cutoff),
                                                       status=OutboxMessage.Status.SENT, sent_at__lt=cutoff)


def prune_sent(older_than_s: float, *, batch_size: int | None = None, dry_run: bool = False) -> int:
    """Delete sent rows whose ``sent_at`` is older than ``older_than_s`` seconds, in batches of
    ``batch_size`` (default ``RETENTION_BATCH_SIZE``), each its own short transaction; returns
    how many were (or would be) deleted. Pending rows are never deleted."""
    size = int(conf.RETENTION_BATCH_SIZE) if batch_size is None else batch_size
    return delete_in_batches(sent_older_than(older_than_s), batch_size=size, dry_run=dry_run).deleted
