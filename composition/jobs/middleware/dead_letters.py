"""Dead-lettering in the worker: a message that failed for good leaves a dead letter, or goes
back on its queue.

Dramatiq's dead-letter queue expires and is not searchable, so it must never be the only copy.
``write_dead_letter`` retries the row through a database blip (``DEAD_LETTER_RETRY_DELAYS_S``); if
the connection stays lost, the message goes back on its queue carrying the failure
(``DEAD_LETTER_PENDING_OPTION``), and its next delivery only tries the write again, never the job.
``DeadLetters`` calls it after a job's last run; ``dead_letter=False`` actors fail without one.
An idempotent job whose message another delivery has committed (its ledger row exists: a host
cut off from the network failed it while its redelivered copy ran elsewhere) leaves none either.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog
from django.db import close_old_connections
from dramatiq.broker import Broker, MessageProxy
from dramatiq.brokers.redis import RedisBroker
from dramatiq.errors import ActorNotFound
from dramatiq.middleware import Middleware, Shutdown, SkipMessage

from composition.db.failures import is_passing
from composition.errors import PermanentError, described
from composition.jobs.current import attempt_of
from composition.jobs.deadletters import FIRST_FAILED_OPTION, Failure, record_dead_letter
from composition.jobs.inbox import ledger_key
from composition.jobs.middleware.in_flight import InFlightRegistry
from composition.jobs.middleware.job_metrics import explained
from composition.jobs.middleware.retries import requeue_message
from composition.jobs.policy import JobPolicy
from composition.metrics import DEAD_LETTER_RECORD_FAILURES_TOTAL, JOBS_TOTAL

__all__ = [
    "DEAD_LETTER_OPTION",
    "DEAD_LETTER_PENDING_OPTION",
    "DEAD_LETTER_RETRY_DELAYS_S",
    "CommittedElsewhere",
    "DeadLetters",
    "Requeue",
    "requeue_as_copy",
    "requeue_rejected",
    "requeue_voids_nack",
    "write_dead_letter",
]

log = structlog.get_logger("composition.jobs")

# Actor (or message) option: False means a message that fails for good leaves no dead letter.
DEAD_LETTER_OPTION = "dead_letter"
# Option of a message requeued because its dead letter could not be written: the failure and
# the attempts to record (``Failure.as_option()`` plus "attempts"), in place of another run.
DEAD_LETTER_PENDING_OPTION = "composition_dead_letter_pending"
# Pauses between tries to write a dead letter (4 tries, about 3 s in all): long enough to ride
# out a database blip or failover, short enough not to hold a worker thread for long.
DEAD_LETTER_RETRY_DELAYS_S = (0.25, 0.75, 2.0)

# How a message whose dead letter could not be written goes back on its queue.
Requeue = Callable[[Broker, MessageProxy], None]


def requeue_as_copy(broker: Broker, message: MessageProxy) -> None:
    """Put a failed message back on its queue, as a copy carrying the dead letter still to write
    (and when it first failed), and have the original acknowledged rather than rejected: a
    rejected one would also sit in the broker's dead-letter queue."""
    requeue_message(broker, message, carry={name: message.options[name] for name in
                                            (DEAD_LETTER_PENDING_OPTION, FIRST_FAILED_OPTION)
                                            if name in message.options})
    message.failed = False


def requeue_rejected(broker: Broker, message: MessageProxy) -> None:
    """Put a message being rejected back on its queue by its Redis id, which turns the nack
    already under way into a no-op. Only for the consumer thread's own rejection: it alone
    fetches this queue for this worker, so nothing can fetch the message again before the nack
    (``requeue_message`` says why that would lose it)."""
    assert isinstance(broker, RedisBroker)
    broker.do_requeue(message.queue_name, message.options["redis_message_id"])


def requeue_voids_nack(broker: Broker, message: MessageProxy) -> bool:
    """Whether ``requeue_rejected`` can put ``message`` back (the Redis broker only)."""
    return isinstance(broker, RedisBroker) and message.options.get("redis_message_id") is not None


class DeadLetters(Middleware):
    """Writes the dead letter of a message whose last run failed (see module doc)."""

    def __init__(self, in_flight: InFlightRegistry) -> None:
        self.in_flight = in_flight

    @property
    def actor_options(self) -> set[str]:
        return {DEAD_LETTER_OPTION}

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        # A message that only waits for its dead letter is not run again: after_skip_message writes it.
        if DEAD_LETTER_PENDING_OPTION in message.options:
            raise SkipMessage("its job failed for good already; only its dead letter is left to write")

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        # A drained job was requeued as it was (JobRetries); anything not failed will run again.
        if exception is None or isinstance(exception, Shutdown) or not message.failed:
            return
        job = self.in_flight.finished(message)
        exception = explained(exception, job)
        attempts = job.attempt if job else attempt_of(message)
        if not _wants_dead_letter(broker, message):
            log.error("job failed for good; its actor keeps no dead letters", error=described(exception),
                      attempts=attempts)
            return
        write_dead_letter(broker, message, exception, attempts)


    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        """A message skipped as failed (Dramatiq's ``AgeLimit``: older than its ``max_age`` when a
        worker took it) is as lost as one whose last run failed: recorded too, not left to the
        broker's expiring dead-letter queue. So is one skipped because it only waits for its
        dead letter (``before_process_message``), whoever skipped it: that letter is written."""
        pending = message.options.get(DEAD_LETTER_PENDING_OPTION)
        if pending is not None:
            _write_pending(broker, message, pending)
            return
        if not message.failed or not _wants_dead_letter(broker, message):
            return
        try:
            max_age = message.options.get("max_age") or broker.get_actor(message.actor_name).options.get("max_age")
        except ActorNotFound:
            return  # UnknownActors records it
        JOBS_TOTAL.labels(message.actor_name, "dead").inc()
        write_dead_letter(broker, message, PermanentError(
            f"expired unrun: older than its max_age ({max_age} ms) when a worker took it"), attempt_of(message))


def _write_pending(broker: Broker, message: MessageProxy, pending: Any) -> None:
    try:
        failure = Failure.from_option(pending)
        attempts = int(pending["attempts"])
    except (ValueError, KeyError, TypeError):
        # Not what requeue_as_copy writes (a hand-made message): recorded as what it is.
        failure, attempts = Failure.of(PermanentError(f"unreadable {DEAD_LETTER_PENDING_OPTION} option")), 0
    message.fail()  # recorded as every failure is (into the broker's DLQ too), unless requeued again
    write_dead_letter(broker, message, failure, attempts)


def write_dead_letter(broker: Broker, message: MessageProxy, exception: BaseException | Failure, attempts: int, *,
                      requeue: Requeue | None = requeue_as_copy) -> None:
    """Write the dead letter, retrying through a database blip; failing that, put the message
    back on its queue with ``requeue`` (none: it cannot be), carrying the failure, so that the
    dead letter is written on its next delivery (``DEAD_LETTER_PENDING_OPTION``).
    Never raises for a failed write: it is logged critical and counted."""
    failure = exception if isinstance(exception, Failure) else Failure.of(exception)
    error = failure.summary
    try:
        dead_letter_id, record_error, database_lost = _record_with_retries(
            message, failure, attempts, error, ledger=_ledger_of_idempotent(broker, message))
    except CommittedElsewhere:
        log.warning("job failed here, but another delivery of its message committed its effects: no dead letter",
                    error=error, attempts=attempts)
        return
    if dead_letter_id is not None:
        # With its arguments: the ids that say which invoice, order or account it was about.
        log.error("job dead-lettered", error=error, attempts=attempts, dead_letter_id=dead_letter_id,
                  payload=message.kwargs, args=message.args)
        return
    if requeue is None or not database_lost:
        DEAD_LETTER_RECORD_FAILURES_TOTAL.labels(message.actor_name, "broker_dlq").inc()
        log.critical("could not record dead letter; only the broker's expiring dead-letter queue holds the "
                     "message", error=error, record_error=record_error, queue=message.queue_name,
                     payload=message.kwargs, args=message.args)
        return
    message.options[DEAD_LETTER_PENDING_OPTION] = {**failure.as_option(), "attempts": attempts}
    try:
        requeue(broker, message)
    except Exception as exc:
        DEAD_LETTER_RECORD_FAILURES_TOTAL.labels(message.actor_name, "broker_dlq").inc()
        log.critical("could not record dead letter nor requeue the message; only the broker's expiring "
                     "dead-letter queue holds it", error=error, record_error=record_error,
                     requeue_error=described(exc), queue=message.queue_name,
                     payload=message.kwargs, args=message.args)
        return
    DEAD_LETTER_RECORD_FAILURES_TOTAL.labels(message.actor_name, "requeued").inc()
    log.critical("could not record dead letter; message requeued, to be recorded (not run) again later",
                 error=error, record_error=record_error, queue=message.queue_name,
                 payload=message.kwargs, args=message.args)


class CommittedElsewhere(Exception):
    """The failed message's ledger row exists: another delivery committed its effects."""


def _record_with_retries(message: MessageProxy, failure: Failure, attempts: int, error: str, *,
                         ledger: str | None) -> tuple[int | None, str, bool]:
    """The dead letter's id, or None, the last recording error and whether that error passes
    (``composition.db.failures.is_passing``: worth a requeue, the database comes back) rather than
    one that would fail the same way every time (no requeue: recording it would be retried
    forever). Raises ``CommittedElsewhere`` when the ledger row ``ledger`` exists, looked up at
    each try."""
    from composition.jobs.models import ProcessedMessage

    record_error = ""
    for delay_s in (*DEAD_LETTER_RETRY_DELAYS_S, None):
        try:
            if ledger is not None and ProcessedMessage.objects.filter(message_id=ledger).exists():
                raise CommittedElsewhere(ledger)
            return record_dead_letter(message, failure, attempts), "", False
        except CommittedElsewhere:
            raise
        except Exception as exc:
            if not is_passing(exc):
                close_old_connections()
                return None, described(exc), False
            record_error = described(exc)
            # A connection the error broke is replaced on the next try.
            close_old_connections()
            if delay_s is None:
                break
            log.warning("could not record dead letter, retrying", error=error, record_error=record_error,
                        retry_in_s=delay_s)
            time.sleep(delay_s)
    return None, record_error, True


def _ledger_of_idempotent(broker: Broker, message: MessageProxy) -> str | None:
    """The ledger key of ``message`` if it is an idempotent job's, else None."""
    try:
        policy = broker.get_actor(message.actor_name).options.get("job_policy")
    except ActorNotFound:
        return None
    return ledger_key(message) if isinstance(policy, JobPolicy) and policy.idempotent else None


def _wants_dead_letter(broker: Broker, message: MessageProxy) -> bool:
    """Per-message option, else the actor's, else yes (an unknown actor always gets one)."""
    try:
        declared = broker.get_actor(message.actor_name).options.get(DEAD_LETTER_OPTION, True)
    except ActorNotFound:
        declared = True
    return message.options.get(DEAD_LETTER_OPTION, declared) is not False
