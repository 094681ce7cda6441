"""Each queue's recent history, for the operations page's charts: per bucket of
``QUEUE_HISTORY_BUCKET_S`` (60 s) its depth, the runs that ended and failed, and whether it was
paused or shed.

Every worker process adds to the current bucket at each metrics sampling round
(``HistoryRecorder``; ``record_buckets``, one statement); ``recent_buckets`` reads the last
``HISTORY_BUCKETS`` of every queue in one query. Old rows go with retention
(``QUEUE_HISTORY_RETENTION_S``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import structlog
from django.db import connection
from dramatiq.broker import Broker

from composition.conf import conf
from composition.errors import described
from composition.jobs.middleware.stack import find_in_flight
from composition.pauses import Pause
from composition.queues.models import QueueBucket

if TYPE_CHECKING:
    from composition.sampling.component import Sample

__all__ = ["HISTORY_BUCKETS", "Bucket", "EndedRuns", "HistoryRecorder", "bucket_start", "recent_buckets",
           "record_buckets"]

log = structlog.get_logger("composition.queues")

# The page shows this many buckets: an hour at the default bucket of 60 s.
HISTORY_BUCKETS = 60

_UPSERT = """
INSERT INTO composition_queuebucket (queue, started_at, depth, processed, failed, paused, shed)
VALUES {values}
ON CONFLICT (queue, started_at) DO UPDATE SET
    depth = GREATEST(composition_queuebucket.depth, EXCLUDED.depth),
    processed = composition_queuebucket.processed + EXCLUDED.processed,
    failed = composition_queuebucket.failed + EXCLUDED.failed,
    paused = composition_queuebucket.paused OR EXCLUDED.paused,
    shed = composition_queuebucket.shed OR EXCLUDED.shed
"""


def bucket_start(at_s: float, bucket_s: float) -> datetime:
    """The start of the bucket holding Unix time ``at_s``."""
    return datetime.fromtimestamp(at_s - at_s % bucket_s, tz=UTC)


class EndedRuns:
    """Turns a process's running totals of ended runs ((queue, failed) → count) into what ended
    since the last call."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, bool], int] = {}

    def since_last(self, totals: Mapping[tuple[str, bool], int]) -> dict[str, tuple[int, int]]:
        """queue → (processed, failed) since the last call."""
        ended: dict[str, tuple[int, int]] = {}
        for (queue, failed), total in totals.items():
            delta = total - self._last.get((queue, failed), 0)
            if delta:
                processed, failures = ended.get(queue, (0, 0))
                ended[queue] = (processed + delta, failures + (delta if failed else 0))
        self._last = dict(totals)
        return ended


def record_buckets(depths: Mapping[str, int | None], ended: Mapping[str, tuple[int, int]], *,
                   now_s: float | None = None) -> None:
    """Add one round's readings to the current bucket of every queue in ``depths`` or ``ended``."""
    queues = sorted(set(depths) | set(ended))
    if not queues:
        return
    pauses = dict(Pause.objects.filter(kind=Pause.QUEUE, name__in=queues, paused=True).values_list("name", "shed"))
    started = bucket_start(time.time() if now_s is None else now_s, float(conf.QUEUE_HISTORY_BUCKET_S))
    params: list[Any] = []
    for queue in queues:
        processed, failed = ended.get(queue, (0, 0))
        params += [queue, started, depths.get(queue), processed, failed, queue in pauses, bool(pauses.get(queue))]
    values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * len(queues))
    with connection.cursor() as cursor:
        cursor.execute(_UPSERT.format(values=values), params)


class HistoryRecorder:
    """A sampling round's depths, and the runs this process ended since the last round (from the
    in-flight registry of ``broker``), into the current buckets. A failure is logged and that
    round's runs are left out of the chart.

    The largest depth reading of a bucket wins (every process reads the same broker), the runs are
    summed over the processes, and any reading of a paused or shed queue marks the bucket."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._ended = EndedRuns()

    def __call__(self, sample: Sample) -> None:
        registry = find_in_flight(self.broker)
        ended = self._ended.since_last(registry.ended_totals()) if registry is not None else {}
        depths = {queue.queue: (queue.depth if queue.broker is not None else None) for queue in sample.queues or ()}
        try:
            record_buckets(depths, ended)
        except Exception as exc:
            log.warning("could not record the queues' history", error=described(exc))


@dataclass(frozen=True)
class Bucket:
    started_at: datetime
    depth: int | None
    processed_per_min: float
    failed_per_min: float
    paused: bool
    shed: bool


def recent_buckets(queues: Iterable[str], *, now_s: float | None = None) -> dict[str, list[Bucket | None]]:
    """queue → its last ``HISTORY_BUCKETS`` buckets, oldest first, None where nothing was recorded
    (no worker ran then); the counts as rates per minute. One query."""
    bucket_s = float(conf.QUEUE_HISTORY_BUCKET_S)
    last = bucket_start(time.time() if now_s is None else now_s, bucket_s)
    starts = [last - timedelta(seconds=bucket_s * back) for back in range(HISTORY_BUCKETS - 1, -1, -1)]
    index = {start: position for position, start in enumerate(starts)}
    names = list(queues)
    history: dict[str, list[Bucket | None]] = {queue: [None] * HISTORY_BUCKETS for queue in names}
    per_min = 60.0 / bucket_s
    for row in QueueBucket.objects.filter(queue__in=names, started_at__gte=starts[0]):
        position = index.get(row.started_at)
        if position is not None:
            history[row.queue][position] = Bucket(row.started_at, row.depth, row.processed * per_min,
                                                  row.failed * per_min, row.paused, row.shed)
    return history
