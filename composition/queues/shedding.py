"""``ShedController``: non-essential queues that pause on their own under pressure.

Every worker process runs one. When a pressure signal of the essential queues
(``composition.queues.pressure``) is at or over its limit, it sheds every queue of
``SHED_QUEUES`` not paused already (a pause marked ``shed``, whose reason names the signal);
once every signal has stayed below ``SHED_RESUME_BELOW`` of its limit for
``SHED_RESUME_AFTER_S``, it resumes them. One episode is one pause and one resume, whichever
process makes them; an operator's pause or resume wins, and an essential queue an operator
paused is not measured.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import ClassVar

import structlog
from django.utils import timezone

from composition.broker.configured import configured_broker
from composition.conf import conf
from composition.lifecycle.periodic import PeriodicComponent
from composition.metrics import QUEUE_SHEDS_TOTAL, SHEDDING_PRESSURE_RATIO
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.pauses import MAX_REASON_CHARS, Pause, pause, resume
from composition.queues.pressure import Reading, read_pressure
from composition.sampling.queues import declared_queues

__all__ = ["SHEDDING_BY", "ShedController", "essential_queues"]

log = structlog.get_logger("composition.queues")

# Who a shed or unshed is by, on the row and in the log.
SHEDDING_BY = "shedding"


def essential_queues() -> list[str]:
    """``SHED_ESSENTIAL_QUEUES``, or every declared queue but the shed ones and the relay's."""
    if conf.SHED_ESSENTIAL_QUEUES is not None:
        return list(conf.SHED_ESSENTIAL_QUEUES)
    shed = set(conf.SHED_QUEUES or ())
    return [queue for queue in declared_queues(configured_broker()) if queue not in shed and queue != RELAY_QUEUE_NAME]


# Between the two levels nothing changes: the gap and the hold are what keep it from flapping.
# The controllers of all processes measure the same signals and change the same rows under a row
# lock, so one episode is one pause and one resume. A queue an operator paused is never resumed
# by a controller, and one an operator resumed during an episode stays resumed until that episode
# ends (as this process saw it begin: a process started since then may shed it again).
class ShedController(PeriodicComponent):
    """Sheds and resumes ``SHED_QUEUES`` by the pressure (see module doc)."""

    name = "shedding"
    depends_on = ("database", "broker")
    interval_setting: ClassVar[str | None] = "SHED_INTERVAL_S"
    failure_event = "shedding round failed; nothing changed"
    logger = log

    def __init__(self, *, interval_s: float | None = None) -> None:
        super().__init__(interval_s=interval_s)
        self._calm_since: float | None = None
        # When this process saw the current episode of pressure begin (None: no episode).
        self._episode_began: datetime | None = None

    def tick(self) -> None:
        shed = list(conf.SHED_QUEUES or ())
        rows = list(Pause.objects.filter(kind=Pause.QUEUE).values_list("name", "paused", "shed", "changed_at"))
        # Shed under an earlier setting (a deploy took it out of SHED_QUEUES, or turned shedding
        # off): nothing below would ever resume it, and the alerts leave paused queues out.
        for name, is_paused, is_shed, _ in rows:
            if is_paused and is_shed and name not in shed:
                resume(Pause.QUEUE, name, by=SHEDDING_BY, reason="no longer in SHED_QUEUES", shed=True)
        if not shed:
            return
        # A queue an operator paused waits on purpose (as the alerts leave it out): its backlog
        # is no pressure to shed others for.
        paused = {name for name, is_paused, _, _ in rows if is_paused}
        # Nor is the time a just-resumed queue's messages spent paused.
        resumed_at = {name: changed_at.timestamp() for name, is_paused, _, changed_at in rows if not is_paused}
        essential = [queue for queue in essential_queues() if queue not in paused]
        readings = read_pressure(configured_broker(), essential, dict(conf.SHED_WHEN or {}), resumed_at)
        for reading in readings:
            if reading.value is not None:
                SHEDDING_PRESSURE_RATIO.labels(reading.signal).set(reading.value / reading.limit)
        over = [reading for reading in readings if reading.over]
        if over:
            self._calm_since = None
            if self._episode_began is None:
                self._episode_began = timezone.now()
            self._shed(shed, over)
            return
        if not all(reading.calm(float(conf.SHED_RESUME_BELOW)) for reading in readings):
            self._calm_since = None  # between the levels: hold whatever is
            return
        now = time.monotonic()
        if self._calm_since is None:
            self._calm_since = now
        if now - self._calm_since >= float(conf.SHED_RESUME_AFTER_S):
            self._unshed(shed, readings)
            self._episode_began = None

    def _shed(self, queues: list[str], over: list[Reading]) -> None:
        rows = {row.name: row for row in Pause.objects.filter(kind=Pause.QUEUE, name__in=queues)}
        # Cut to what a pause keeps: many essential queues must not stop the shedding.
        reason = ("shed: " + "; ".join(reading.describe() for reading in over))[:MAX_REASON_CHARS]
        for queue in queues:
            row = rows.get(queue)
            if row is not None and row.paused:
                continue  # shed already, or paused by an operator
            if (row is not None and not row.shed and self._episode_began is not None
                    and row.changed_at >= self._episode_began):
                continue  # an operator resumed it during this episode: theirs until it ends
            _, changed = pause(Pause.QUEUE, queue, by=SHEDDING_BY, reason=reason, shed=True)
            if changed:
                QUEUE_SHEDS_TOTAL.labels(queue, over[0].signal).inc()

    def _unshed(self, queues: list[str], readings: list[Reading]) -> None:
        shed = Pause.objects.filter(kind=Pause.QUEUE, name__in=queues, paused=True, shed=True)
        if not shed.exists():
            return
        reason = (f"pressure below {float(conf.SHED_RESUME_BELOW):g} of every limit for "
                  f"{float(conf.SHED_RESUME_AFTER_S):g} s: "
                  + "; ".join(reading.describe() for reading in readings))[:MAX_REASON_CHARS]
        for queue in shed.values_list("name", flat=True):
            resume(Pause.QUEUE, queue, by=SHEDDING_BY, reason=reason, shed=True)
