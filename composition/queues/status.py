"""Each queue as an operator sees it (``queue_rows``): its depth and broker counts, how long its
oldest work has waited, what went through it lately, and whether it is paused, by whom, since
when and why. ``manage.py queues list`` and the operations page show these rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from composition.backpressure.depth import BrokerCounts, backlog
from composition.broker.configured import configured_broker
from composition.jobs.middleware.in_flight import RUNS_WINDOW_S
from composition.outbox.maintenance import QueueBacklog, backlog_by_queue
from composition.pauses import Pause
from composition.sampling.queues import declared_queues, sample_queues

__all__ = ["QueueRow", "queue_rows"]

log = structlog.get_logger("composition.queues")


@dataclass(frozen=True)
class QueueRow:
    name: str
    outbox_pending: int
    oldest_pending_age_s: float | None
    broker: BrokerCounts | None  # None when the broker could not be asked
    broker_error: str | None
    broker_oldest_age_s: float | None  # the oldest ready message's wait (Redis only)
    enqueued_per_min: float  # rows relayed to the broker, over the window
    processed_per_min: float | None  # runs ended, summed over the workers' heartbeats (None: unknown)
    pause: Pause | None  # the queue's pause row while it is paused

    @property
    def depth(self) -> int | None:
        """``backpressure.depth.backlog``, or None (unknown) when the broker could not be asked."""
        return None if self.broker is None else backlog(self.outbox_pending, self.broker)

    @property
    def pending_age_s(self) -> float | None:
        """How long its oldest pending outbox row has waited; None when none is pending."""
        return self.oldest_pending_age_s if self.outbox_pending else None

    @property
    def ready_age_s(self) -> float | None:
        """(Redis) how long its oldest ready message has waited; None when none is ready, or on
        RabbitMQ (an empty queue read "0.0 s", as if something had just arrived)."""
        if self.broker_oldest_age_s is None or (self.broker is not None and not self.broker.ready):
            return None
        return self.broker_oldest_age_s

    @property
    def oldest_age_s(self) -> float | None:
        """How long its oldest work has waited (a pending outbox row, or a ready message); None
        when nothing waits."""
        ages = [age for age in (self.pending_age_s, self.ready_age_s) if age is not None]
        return max(ages) if ages else None


def queue_rows(*, window_s: float = RUNS_WINDOW_S, runs: Mapping[str, int] | None = None,
               outbox: Mapping[str, QueueBacklog] | None = None) -> list[QueueRow]:
    """Every declared queue, and any with outbox rows, runs in ``runs`` (runs ended per queue over
    ``RUNS_WINDOW_S``, from the heartbeats; None: unknown) or a pause. ``outbox`` is
    ``backlog_by_queue(window_s)`` when the caller has it already. A broker that cannot be asked
    is reported on its rows, never raised."""
    outbox = backlog_by_queue(window_s) if outbox is None else outbox
    pauses = {row.name: row for row in Pause.objects.filter(kind=Pause.QUEUE, paused=True)}
    broker = configured_broker()
    names = sorted(set(declared_queues(broker)) | set(outbox) | set(runs or ()) | set(pauses))
    rows = []
    # The metrics sampler's own reading of the broker (one round trip per queue, and none after
    # the broker has failed once).
    for sample in sample_queues(broker, names):
        name, waiting = sample.queue, outbox.get(sample.queue)
        if sample.error:
            log.warning("broker counts unavailable", queue=name, error=sample.error)
        rows.append(QueueRow(
            name=name, outbox_pending=waiting.pending if waiting else 0,
            oldest_pending_age_s=waiting.oldest_pending_age_s if waiting else None,
            broker=sample.broker, broker_error=sample.error.split(":", 1)[0] if sample.error else None,
            broker_oldest_age_s=sample.oldest_age_s,
            enqueued_per_min=(waiting.relayed_recently if waiting else 0) * 60.0 / window_s,
            processed_per_min=None if runs is None else runs.get(name, 0) * 60.0 / RUNS_WINDOW_S,
            pause=pauses.get(name)))
    return rows
