"""``composition.outbox.ops``: the outbox's status, gauges and pruning under their first import path.

They live in ``composition.outbox.maintenance``.
"""

from composition.outbox.maintenance import (
    OutboxStatus,
    QueueBacklog,
    backlog_by_queue,
    backlog_totals,
    outbox_status,
    pending_summary,
    prune_sent,
    refresh_gauges,
    sent_older_than,
)

__all__ = ["OutboxStatus", "QueueBacklog", "backlog_by_queue", "backlog_totals", "outbox_status", "pending_summary",
           "prune_sent", "refresh_gauges", "sent_older_than"]
