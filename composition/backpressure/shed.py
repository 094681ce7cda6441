"""Which queues the shedding controller has shed now, as one process last read them.

``ShedQueues.get`` answers from a reading at most ``max_age_s`` old; one thread at a time
re-reads (one indexed query), the others keep the previous answer. A database that cannot be
read leaves the last answer standing (logged): admission must not fail a request for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import structlog

from composition.errors import described

__all__ = ["ShedQueues"]

log = structlog.get_logger("composition.backpressure")


class ShedQueues:
    def __init__(self) -> None:
        self._names: frozenset[str] = frozenset()
        self._read_at = float("-inf")
        self._reading = threading.Lock()

    def get(self, candidates: Iterable[str], *, max_age_s: float) -> frozenset[str]:
        """The queues of ``candidates`` shed now (read at most ``max_age_s`` ago)."""
        if time.monotonic() - self._read_at < max_age_s or not self._reading.acquire(blocking=False):
            return self._names
        try:
            # Late: importing a model needs the app registry, and this module is imported before.
            from composition.pauses.models import Pause

            self._names = frozenset(Pause.objects.filter(kind=Pause.QUEUE, name__in=list(candidates), paused=True,
                                                         shed=True).values_list("name", flat=True))
        except Exception as exc:
            log.warning("could not read which queues are shed; the last reading stands", error=described(exc))
        finally:
            self._read_at = time.monotonic()
            self._reading.release()
        return self._names

    def clear(self) -> None:
        self._names, self._read_at = frozenset(), float("-inf")
