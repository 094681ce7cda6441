"""The Dramatiq middleware that carries the job policy.

- ``JobRetries`` is Dramatiq's own ``Retries`` with two changes: the delay comes from
  ``composition.jobs.policy.backoff_s`` (exponential with jitter, within [initial, max]) instead
  of Dramatiq's (whose jitter can fall below the minimum), and a job interrupted by a drain
  (Dramatiq's ``Shutdown``) goes back on its queue as it was, without using an attempt.
- ``JobMiddleware`` wraps every message: ``close_old_connections()`` before and after (worker
  threads never see ``request_finished``), a fresh structlog context bound with job_id, actor and
  attempt, the in-flight table the heartbeat reports, the job metrics, and the dead letter when
  the message failed for good (including a message for an actor this worker does not know,
  which Dramatiq rejects before any job runs). An actor declared with ``dead_letter=False`` (the
  outbox relay's nudges) fails without one.

Dramatiq's broker-side dead-letter queue expires and is not searchable, so it must never be the
only copy: writing the dead letter is retried for a few seconds, and when the database stays
unreachable the message goes back on its queue to fail (and be recorded) again later.

``job_middleware()`` is the broker's full middleware list (Dramatiq's defaults with these two).
"""

from __future__ import annotations

import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import structlog
from django.db import InterfaceError, OperationalError, close_old_connections, connections
from dramatiq.broker import Broker, MessageProxy
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis
from dramatiq.errors import ActorNotFound, Retry
from dramatiq.middleware import Middleware, Retries, Shutdown, TimeLimit, default_middleware

from composition.jobs.deadletters import FIRST_FAILED_OPTION, record_dead_letter
from composition.jobs.policy import backoff_s
from composition.metrics import (
    DEAD_LETTER_RECORD_FAILURES_TOTAL,
    JOB_DURATION_SECONDS,
    JOB_TIMEOUTS_TOTAL,
    JOBS_IN_PROGRESS,
    JOBS_TOTAL,
)
from composition.time_limits import JobTimeLimit, TimeLimitExceeded

__all__ = [
    "BACKOFF_OPTION",
    "DEAD_LETTER_OPTION",
    "DEAD_LETTER_RETRY_DELAYS_S",
    "InFlight",
    "JobMiddleware",
    "JobRetries",
    "current_message",
    "find_job_middleware",
    "job_middleware",
    "requeue_message",
]

log = structlog.get_logger("composition.jobs")

# message.options key holding the delay (ms) computed before this attempt, for logs and tests.
BACKOFF_OPTION = "composition_backoff_ms"
# Actor (or message) option: False means a message that fails for good leaves no dead letter.
DEAD_LETTER_OPTION = "dead_letter"
# Pauses between tries to write a dead letter (4 tries, about 3 s in all): long enough to ride
# out a database blip or failover, short enough not to hold a worker thread for long.
DEAD_LETTER_RETRY_DELAYS_S = (0.25, 0.75, 2.0)

_current: ContextVar[MessageProxy | None] = ContextVar("composition_current_message", default=None)


def current_message() -> MessageProxy | None:
    """The message the calling worker thread is running, or None outside a job."""
    return _current.get()


def attempt_of(message: MessageProxy) -> int:
    """Which run of the message this is, from 1 (Dramatiq counts retries, from 0)."""
    return int(message.options.get("retries", 0)) + 1


def requeue_message(broker: Broker, message: MessageProxy) -> None:
    """Put a fetched message back at the end of its queue unchanged (same retries count).

    On Redis this moves the broker's own copy back from this worker's unacked set, so the
    worker's later acknowledgement of it does nothing; elsewhere a copy is enqueued and the
    original is acknowledged as usual.
    """
    redis_id = message.options.get("redis_message_id")
    if isinstance(broker, RedisBroker) and redis_id is not None:
        broker.do_requeue(message.queue_name, redis_id)
    else:
        broker.enqueue(message.copy())


class JobRetries(Retries):
    """Dramatiq's Retries with the composition backoff and shutdown requeue (see module doc)."""

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        if exception is None:
            return
        if isinstance(exception, Shutdown):
            requeue_message(broker, message)
            return
        message.options.setdefault(FIRST_FAILED_OPTION, current_millis())
        try:
            actor = broker.get_actor(message.actor_name)
        except ActorNotFound:
            # Nothing can run it, however often it is retried; JobMiddleware dead-letters it.
            message.fail()
            return
        throws = message.options.get("throws") or actor.options.get("throws")
        permanent = throws is not None and isinstance(exception, throws)
        if not permanent and not (isinstance(exception, Retry) and exception.delay is not None):
            retries = int(message.options.get("retries", 0))
            min_ms = message.options.get("min_backoff", actor.options.get("min_backoff", self.min_backoff))
            max_ms = message.options.get("max_backoff", actor.options.get("max_backoff", self.max_backoff))
            delay_ms = int(backoff_s(retries, initial_s=min_ms / 1000, max_s=max_ms / 1000) * 1000)
            message.options[BACKOFF_OPTION] = delay_ms
            # Retries takes a Retry's delay as given; the original stays the current exception,
            # so the traceback Retries stores is still the job's own.
            exception = Retry(str(exception), delay=delay_ms)
        super().after_process_message(broker, message, result=result, exception=exception)


@dataclass(frozen=True)
class InFlight:
    """One job a worker thread is running now."""

    job_id: str
    actor: str
    attempt: int
    started_at: float  # Unix time, for other processes (the heartbeat)
    started_monotonic: float
    time_limit_s: float | None


class JobMiddleware(Middleware):
    """Per-message hygiene, in-flight tracking, metrics and dead letters (see module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight: dict[int, InFlight] = {}

    @property
    def actor_options(self) -> set[str]:
        return {"job_policy", DEAD_LETTER_OPTION}

    # -- what the heartbeat and the drain read ---------------------------------------------------
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
                      "started_at": job.started_at} for job in jobs],
        }

    # -- hooks -------------------------------------------------------------------------------------
    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        close_old_connections()
        attempt = attempt_of(message)
        structlog.contextvars.clear_contextvars()
        context: dict[str, Any] = {"job_id": message.message_id, "actor": message.actor_name,
                                   "attempt": attempt}
        headers = message.options.get("composition")
        if isinstance(headers, dict) and headers.get("request_id"):
            context["request_id"] = headers["request_id"]
        structlog.contextvars.bind_contextvars(**context)
        _current.set(message)
        time_limit_ms = None
        try:
            time_limit_ms = broker.get_actor(message.actor_name).options.get("time_limit")
        except Exception:  # an unknown actor fails later, in the worker, where Dramatiq reports it
            pass
        job = InFlight(message.message_id, message.actor_name, attempt, time.time(), time.monotonic(),
                       time_limit_ms / 1000 if time_limit_ms else None)
        with self._lock:
            self._in_flight[threading.get_ident()] = job
        JOBS_IN_PROGRESS.labels(message.actor_name).inc()

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        job = self._finish(message)
        try:
            if exception is not None or not message.failed:
                self._outcome(broker, message, exception, job)
        finally:
            self._reset()

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self._finish(message)
        self._reset()

    def before_nack(self, broker: Broker, message: MessageProxy) -> None:
        # A message for an actor this worker does not know (a deploy removed or renamed the job)
        # is rejected by Dramatiq's consumer thread without running any other hook: this is the
        # one place to dead-letter it. Messages of known actors were handled after processing.
        try:
            broker.get_actor(message.actor_name)
            return
        except ActorNotFound:
            pass
        error = ActorNotFound(f"no actor named {message.actor_name!r} is declared in this worker "
                              "(removed or renamed by a deploy?)")
        structlog.contextvars.bind_contextvars(job_id=message.message_id, actor=message.actor_name)
        JOBS_TOTAL.labels(message.actor_name, "dead").inc()
        close_old_connections()
        try:
            # The nack is already under way: only Redis's requeue can still turn it into a no-op.
            self._dead_letter(broker, message, error, attempt_of(message),
                              can_requeue=_requeue_voids_nack(broker, message))
        finally:
            self._reset()
            # A consumer thread is no worker thread: it does not keep a database connection.
            connections.close_all()

    # -- helpers -------------------------------------------------------------------------------
    def _finish(self, message: MessageProxy) -> InFlight | None:
        with self._lock:
            job = self._in_flight.pop(threading.get_ident(), None)
        if job is not None:
            JOBS_IN_PROGRESS.labels(message.actor_name).dec()
        return job

    def _outcome(self, broker: Broker, message: MessageProxy, exception: BaseException | None,
                 job: InFlight | None) -> None:
        took_s = time.monotonic() - job.started_monotonic if job else 0.0
        JOB_DURATION_SECONDS.labels(message.actor_name).observe(took_s)
        if exception is None:
            JOBS_TOTAL.labels(message.actor_name, "success").inc()
            log.debug("job succeeded", duration_s=round(took_s, 4))
            return
        if isinstance(exception, TimeLimitExceeded):
            # Raised asynchronously with no message: say which limit, for the logs and the
            # dead letter (the class still names the time-out).
            limit = f"{job.time_limit_s:g}s" if job and job.time_limit_s else "its time limit"
            exception = TimeLimitExceeded(f"job ran longer than {limit} and was interrupted").with_traceback(
                exception.__traceback__)
            JOB_TIMEOUTS_TOTAL.labels(message.actor_name).inc()
            log.warning("job exceeded its time limit", time_limit_s=job.time_limit_s if job else None,
                        duration_s=round(took_s, 4))
        error = f"{type(exception).__name__}: {exception}"
        if isinstance(exception, Shutdown):
            JOBS_TOTAL.labels(message.actor_name, "retry").inc()
            log.warning("job interrupted by shutdown, requeued without using an attempt")
            return
        if not message.failed:
            JOBS_TOTAL.labels(message.actor_name, "retry").inc()
            log.warning("job failed, will retry", error=error, delay_ms=message.options.get(BACKOFF_OPTION))
            return
        JOBS_TOTAL.labels(message.actor_name, "dead").inc()
        attempts = job.attempt if job else attempt_of(message)
        if not _wants_dead_letter(broker, message):
            log.error("job failed for good; its actor keeps no dead letters", error=error, attempts=attempts)
            return
        self._dead_letter(broker, message, exception, attempts)

    def _dead_letter(self, broker: Broker, message: MessageProxy, exception: BaseException, attempts: int, *,
                     can_requeue: bool = True) -> None:
        """Write the dead letter, retrying through a database blip; failing that, put the
        message back on its queue (when ``can_requeue``) so that it fails, and is recorded, again
        later."""
        error = f"{type(exception).__name__}: {exception}"
        dead_letter_id, record_error, database_lost = _record_with_retries(message, exception, attempts, error)
        if dead_letter_id is not None:
            log.error("job dead-lettered", error=error, attempts=attempts, dead_letter_id=dead_letter_id)
            return
        if not can_requeue or not database_lost:
            DEAD_LETTER_RECORD_FAILURES_TOTAL.labels(message.actor_name, "broker_dlq").inc()
            log.critical("could not record dead letter; only the broker's expiring dead-letter queue holds the "
                         "message", error=error, record_error=record_error, queue=message.queue_name,
                         payload=message.kwargs, args=message.args)
            return
        try:
            _requeue_instead_of_rejecting(broker, message)
        except Exception as exc:
            DEAD_LETTER_RECORD_FAILURES_TOTAL.labels(message.actor_name, "broker_dlq").inc()
            log.critical("could not record dead letter nor requeue the message; only the broker's expiring "
                         "dead-letter queue holds it", error=error, record_error=record_error,
                         requeue_error=f"{type(exc).__name__}: {exc}", queue=message.queue_name,
                         payload=message.kwargs, args=message.args)
            return
        DEAD_LETTER_RECORD_FAILURES_TOTAL.labels(message.actor_name, "requeued").inc()
        log.critical("could not record dead letter; message requeued to fail and be recorded again later",
                     error=error, record_error=record_error, queue=message.queue_name,
                     payload=message.kwargs, args=message.args)

    def _reset(self) -> None:
        _current.set(None)
        structlog.contextvars.clear_contextvars()
        close_old_connections()


def _record_with_retries(message: MessageProxy, exception: BaseException, attempts: int,
                         error: str) -> tuple[int | None, str, bool]:
    """The dead letter's id, or None, the last recording error and whether that error was a
    lost connection (worth a requeue: the database comes back) rather than one that would fail
    the same way every time (no requeue: that would rerun the job forever)."""
    record_error = ""
    for delay_s in (*DEAD_LETTER_RETRY_DELAYS_S, None):
        try:
            return record_dead_letter(message, exception, attempts), "", False
        except (OperationalError, InterfaceError) as exc:
            record_error = f"{type(exc).__name__}: {exc}"
            # A connection the error broke is replaced on the next try.
            close_old_connections()
            if delay_s is None:
                break
            log.warning("could not record dead letter, retrying", error=error, record_error=record_error,
                        retry_in_s=delay_s)
            time.sleep(delay_s)
        except Exception as exc:
            close_old_connections()
            return None, f"{type(exc).__name__}: {exc}", False
    return None, record_error, True


def _wants_dead_letter(broker: Broker, message: MessageProxy) -> bool:
    """Per-message option, else the actor's, else yes (an unknown actor always gets one)."""
    try:
        declared = broker.get_actor(message.actor_name).options.get(DEAD_LETTER_OPTION, True)
    except ActorNotFound:
        declared = True
    return message.options.get(DEAD_LETTER_OPTION, declared) is not False


def _requeue_instead_of_rejecting(broker: Broker, message: MessageProxy) -> None:
    """Put a failed message back on its queue so that the broker's nack does not move it to the
    dead-letter queue: on Redis the requeue takes it out of this worker's unacked set, and
    dispatch.lua's nack then finds nothing to move; elsewhere a copy is enqueued and the
    original must be acknowledged, not rejected, or it would exist twice."""
    requeue_message(broker, message)
    if not _requeue_voids_nack(broker, message):
        message.failed = False


def _requeue_voids_nack(broker: Broker, message: MessageProxy) -> bool:
    return isinstance(broker, RedisBroker) and message.options.get("redis_message_id") is not None


def job_middleware() -> list[Middleware]:
    """Dramatiq's default middleware with ``JobRetries`` in place of ``Retries`` and
    ``JobMiddleware`` just before it (after-hooks run in reverse, so the retry decision is made
    before the dead letter is written), and ``JobTimeLimit`` in place of ``TimeLimit``, last:
    armed after every other before-hook, disarmed before any other after-hook runs."""
    stack: list[Middleware] = []
    for middleware_class in default_middleware:
        if middleware_class is Retries:
            stack += [JobMiddleware(), JobRetries()]
        elif middleware_class is TimeLimit:
            continue  # JobTimeLimit goes last, so its after-hook disarms the limit first
        else:
            stack.append(middleware_class())
    return [*stack, JobTimeLimit()]


def find_job_middleware(broker: Broker) -> JobMiddleware | None:
    for middleware in broker.middleware:
        if isinstance(middleware, JobMiddleware):
            return middleware
    return None
