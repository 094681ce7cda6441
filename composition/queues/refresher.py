"""``QueuePauseRefresher``: the worker process's copy of the paused queues, kept fresh.

One thread reads the paused queues (one indexed query) every ``QUEUE_PAUSE_REFRESH_S`` into
``composition.broker.pausing.paused_queues``, where the consumers and the ``PausedQueues``
middleware look them up for the cost of a set lookup; a job of a queue never paused pays
nothing else. The first read happens before the worker threads start, so a pause set before a
restart holds from the first message on. While the database cannot be read, the last state read
stays (logged each round).
"""

from __future__ import annotations

from typing import ClassVar

import structlog

from composition.broker.configured import configured_broker
from composition.broker.pausing import paused_queues
from composition.lifecycle.periodic import PeriodicComponent
from composition.metrics import QUEUE_PAUSED
from composition.queues.control import paused_queue_names
from composition.sampling.queues import declared_queues

__all__ = ["QueuePauseRefresher"]

log = structlog.get_logger("composition.queues")


class QueuePauseRefresher(PeriodicComponent):
    """Reads the paused queues every ``QUEUE_PAUSE_REFRESH_S`` (see module doc)."""

    name = "queue-pauses"
    depends_on = ("database", "broker")
    interval_setting: ClassVar[str | None] = "QUEUE_PAUSE_REFRESH_S"
    tick_at_start = False  # start() has read them already
    # Read until the end: a drain still hands back what a resume would let run.
    stop_on_drain = False
    failure_event = "could not read the paused queues; the last state read holds"
    logger = log

    def start(self) -> None:
        # Each declared queue's gauge at 0, so an alert can tell "not paused" from "not reported".
        for queue in declared_queues(configured_broker()):
            QUEUE_PAUSED.labels(queue).set(0)
        self.tick()
        super().start()

    def tick(self) -> None:
        before = paused_queues.names
        now = paused_queue_names()
        if not paused_queues.replace(now):
            return
        for queue in now - before:
            QUEUE_PAUSED.labels(queue).set(1)
        for queue in before - now:
            QUEUE_PAUSED.labels(queue).set(0)
        log.info("paused queues read", paused=sorted(now), newly_paused=sorted(now - before),
                 resumed=sorted(before - now))

    def stop(self, timeout_s: float) -> None:
        super().stop(timeout_s)
        paused_queues.replace(())  # this process's copy: nothing consumes any more
