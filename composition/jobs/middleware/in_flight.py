"""The in-flight registry: which job each worker thread of this process is running now.

``InFlightRegistry`` enters a job just before it runs and takes it off as soon as it ends, before
any dead letter is written: the drain interrupts only threads found in ``in_flight()``. It feeds
the heartbeat (``state()``, runs per queue over ``RUNS_WINDOW_S``), the
``composition_jobs_in_progress`` gauge and the queues' history (``ended_totals()``, runs ended
per queue, failed or not, since the process started); later after-hooks read the ended run with
``finished(message)``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Middleware, Shutdown

from composition.jobs.current import attempt_of
from composition.jobs.recent_counts import RecentCounts
from composition.metrics import JOBS_IN_PROGRESS, LabelledChildren

__all__ = ["RUNS_WINDOW_S", "InFlight", "InFlightRegistry"]

RUNS_WINDOW_S = 300.0


@dataclass(frozen=True)
class InFlight:
    """One job a worker thread is running now."""

    job_id: str
    actor: str
    attempt: int
    started_at: float  # Unix time, for other processes (the heartbeat)
    started_monotonic: float
    time_limit_s: float | None
    # The Redis broker's id of the message (its acks set holds these); None on RabbitMQ.
    redis_message_id: str | None = None


class InFlightRegistry(Middleware):
    """Thread ident → the job that thread is running (see module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight: dict[int, InFlight] = {}
        # Per worker thread: the entry taken off last, for the after-hooks that run later.
        self._finished = threading.local()
        self._runs = RecentCounts(RUNS_WINDOW_S)
        self._ended: Counter[tuple[str, bool]] = Counter()
        self._in_progress = LabelledChildren(JOBS_IN_PROGRESS)

    def in_flight(self) -> dict[int, InFlight]:
        """Thread ident → the job that thread is running, as a snapshot."""
        with self._lock:
            return dict(self._in_flight)

    def state(self) -> dict[str, Any]:
        """Heartbeat fields: jobs in flight, since when, and how long the oldest may run."""
        jobs = sorted(self.in_flight().values(), key=lambda job: job.started_at)
        oldest = jobs[0] if jobs else None
        return {
            "jobs_in_flight": len(jobs),
            "oldest_job_started_at": oldest.started_at if oldest else None,
            "max_job_s": oldest.time_limit_s if oldest and oldest.time_limit_s else None,
            "jobs": [{"job_id": job.job_id, "actor": job.actor, "attempt": job.attempt,
                      "started_at": job.started_at, "time_limit_s": job.time_limit_s} for job in jobs],
            "runs_window_s": RUNS_WINDOW_S,
            "runs_by_queue": self._runs.totals(),
        }

    def finished(self, message: MessageProxy) -> InFlight | None:
        """The entry of ``message`` that the calling thread took off when its run ended; None
        when it did not run on this thread (skipped, or a hook called on its own)."""
        job: InFlight | None = getattr(self._finished, "job", None)
        return job if job is not None and job.job_id == message.message_id else None

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        self._finished.job = None
        actor_name = message.actor_name
        time_limit_ms = None
        try:
            time_limit_ms = broker.get_actor(actor_name).options.get("time_limit")
        except Exception:  # an unknown actor fails later, in the worker, where Dramatiq reports it
            pass
        job = InFlight(message.message_id, actor_name, attempt_of(message), time.time(),
                       time.monotonic(), time_limit_ms / 1000 if time_limit_ms else None,
                       message.options.get("redis_message_id"))
        with self._lock:
            self._in_flight[threading.get_ident()] = job
        self._in_progress(actor_name).inc()

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        # A run a drain interrupted is handed back, not failed: counted as neither.
        failed = None if isinstance(exception, Shutdown) else exception is not None
        self._finished.job = self._take(message, failed)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self._finished.job = self._take(message, None)

    def _take(self, message: MessageProxy, failed: bool | None) -> InFlight | None:
        with self._lock:
            job = self._in_flight.pop(threading.get_ident(), None)
            if job is not None and failed is not None:
                self._ended[(message.queue_name, failed)] += 1
        if job is not None:
            self._in_progress(job.actor).dec()
            self._runs.add(message.queue_name)
        return job

    def ended_totals(self) -> dict[tuple[str, bool], int]:
        """(queue, failed) → runs ended since this process started (a retry counts as failed)."""
        with self._lock:
            return dict(self._ended)
