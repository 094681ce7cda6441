"""What the operations page shows, gathered from the functions the commands use: each queue
(``queues list``'s rows: outbox backlog, broker counts, pause) and its last hour
(``composition.queues.history``), the outbox totals (``backlog_totals``, which ``outbox status``
reports too), failure groups (``deadletters list``), worker heartbeats (``health workers``),
circuit breakers, the schedules (``schedules list``) and the job limits (``queues limits``).

Every figure costs a fixed number of queries and round trips, whatever the size of the tables:
aggregates over partial indexes, and per queue one broker round trip.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import structlog
from django.utils import timezone

from composition import health
from composition.breaker import breaker_states
from composition.broker.configured import configured_broker
from composition.conf import conf
from composition.jobs.deadletters import open_failures, open_purged
from composition.jobs.failure_groups import failure_groups, group_count
from composition.jobs.middleware.in_flight import RUNS_WINDOW_S
from composition.jobs.models import BrokerEpoch, DeadLetter
from composition.outbox.maintenance import backlog_by_queue, backlog_totals
from composition.queues.history import Bucket, recent_buckets
from composition.queues.status import QueueRow, queue_rows
from composition.sampling.limits import LimitSample, sample_limits
from composition.schedules.status import ScheduleRow, schedule_rows

__all__ = ["OperationsSnapshot", "WorkerRow", "operations_snapshot"]

log = structlog.get_logger("composition.operations")

# The failure groups listed; the rest are counted and reachable from the dead letters list.
FAILURE_GROUPS_SHOWN = 50


@dataclass(frozen=True)
class WorkerRow:
    worker: str
    beat_age_s: float
    jobs_in_flight: int
    oldest_job: dict[str, Any] | None
    oldest_job_age_s: float | None
    stuck: bool
    breakers: dict[str, str]
    paused_queues: list[str]  # as this process last read them


@dataclass(frozen=True)
class OperationsSnapshot:
    taken_at: float
    window_s: float
    queues: list[QueueRow]
    open_dead_letters: int  # open_failures(), as composition_dead_letters_open
    purged_dead_letters: int  # open_purged()
    failure_groups: list[dict[str, Any]]  # the FAILURE_GROUPS_SHOWN largest
    failure_group_count: int  # all of them
    workers: list[WorkerRow]
    stale_workers: list[dict[str, Any]]
    workers_error: str | None
    breakers_here: dict[str, str]
    relay_lag_s: float | None  # None when nothing is pending
    outbox_pending: int
    schedules: list[ScheduleRow] = field(default_factory=list)
    # queue → its last HISTORY_BUCKETS buckets (composition.queues.history), oldest first.
    history: dict[str, list[Bucket | None]] = field(default_factory=dict)
    limits: list[LimitSample] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The latest loss of the Redis broker's data (composition.jobs.broker_losses) within
    # BROKER_LOSS_LOOKBACK_S: when, how many jobs it sent again, whether it still reconciles.
    broker_loss: dict[str, Any] | None = None


def _broker_loss() -> dict[str, Any] | None:
    since = timezone.now() - timedelta(seconds=float(conf.BROKER_LOSS_LOOKBACK_S))
    epoch = BrokerEpoch.objects.filter(lost=True, began_at__gte=since).order_by("-id").first()
    if epoch is None:
        return None
    return {"began_at": epoch.began_at, "resent": epoch.resent, "open": epoch.closed_at is None, "cause": epoch.cause}


def _workers(now: float) -> tuple[list[WorkerRow], list[dict[str, Any]], str | None, dict[str, int]]:
    report = health.workers()
    if "error" in report.detail:
        return [], [], str(report.detail["error"]), {}
    stuck = set(report.detail.get("stuck", []))
    rows: list[WorkerRow] = []
    runs: dict[str, int] = {}
    for beat in report.detail.get("workers", []):
        jobs = beat.get("jobs") or []
        oldest = jobs[0] if jobs else None
        rows.append(WorkerRow(
            worker=beat["worker"], beat_age_s=max(0.0, now - beat["beat_at"]),
            jobs_in_flight=int(beat.get("jobs_in_flight", 0)), oldest_job=oldest,
            oldest_job_age_s=max(0.0, now - oldest["started_at"]) if oldest else None,
            stuck=beat["worker"] in stuck, breakers=dict(beat.get("breakers") or {}),
            paused_queues=list(beat.get("paused_queues") or [])))
        for queue, count in (beat.get("runs_by_queue") or {}).items():
            runs[queue] = runs.get(queue, 0) + int(count)
    stale = [{**row, "age_s": max(0.0, now - row["beat_at"])} for row in report.detail.get("stale", [])]
    return rows, stale, None, runs


def operations_snapshot(*, window_s: float = RUNS_WINDOW_S) -> OperationsSnapshot:
    """Everything the page shows, now. A broker or Redis that cannot be asked is reported on
    the page, never raised: the page is for the night things are broken."""
    now = time.time()
    backlog = backlog_by_queue(window_s)
    workers, stale, workers_error, runs = _workers(now)
    queues = queue_rows(window_s=window_s, runs=None if workers_error else runs, outbox=backlog)
    # The groups list a purge's letters too (it is where they are replayed from); the count does
    # not, as composition_dead_letters_open does not.
    open_letters = DeadLetter.objects.filter(status=DeadLetter.Status.DEAD)
    outbox_pending, relay_lag_s = backlog_totals(backlog)  # `outbox status`'s pending and oldest age
    return OperationsSnapshot(
        taken_at=now, window_s=window_s, queues=queues, open_dead_letters=open_failures().count(),
        purged_dead_letters=open_purged().count(),
        failure_groups=failure_groups(open_letters, limit=FAILURE_GROUPS_SHOWN),
        failure_group_count=group_count(open_letters), workers=workers,
        stale_workers=stale, workers_error=workers_error, breakers_here=breaker_states(),
        relay_lag_s=relay_lag_s, outbox_pending=outbox_pending, schedules=schedule_rows(),
        history=recent_buckets(queue.name for queue in queues), limits=sample_limits(configured_broker()),
        broker_loss=_broker_loss())
