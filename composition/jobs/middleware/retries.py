"""The retry policy in the worker: ``JobRetries``, Dramatiq's ``Retries`` with three changes.

The delay comes from ``composition.jobs.policy.backoff_s``; a job interrupted by a drain
(``Shutdown``) goes back on its queue without using an attempt; a retry the broker will not take is
tried again for a few seconds, then the message is dead-lettered rather than acked with its retry
lost. Everything else (``max_retries``, ``throws``, a ``Retry`` with its own delay) is Dramatiq's.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import structlog
from dramatiq.broker import Broker, MessageProxy
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis
from dramatiq.errors import ActorNotFound, Retry
from dramatiq.message import Message
from dramatiq.middleware import Retries, Shutdown

from composition.broker.redis import requeue_as_new
from composition.errors import BROKER_FAILURES, described, exception_text
from composition.jobs.deadletters import FIRST_FAILED_OPTION
from composition.jobs.policy import backoff_s
from composition.outbox.publish import PAYLOAD_SCHEMA_OPTION, VERSIONS_OPTION

__all__ = ["BACKOFF_OPTION", "RETRY_ENQUEUE_PAUSES_S", "JobRetries", "requeue_message"]

# message.options key holding the delay (ms) computed before this attempt, for logs and tests.
BACKOFF_OPTION = "composition_backoff_ms"
# Pauses before enqueueing a retry again after the broker refused it; then the message fails.
RETRY_ENQUEUE_PAUSES_S = (0.5, 1.0, 2.0)

log = structlog.get_logger("composition.jobs")

# Per worker thread, the message it runs and the options it started with (options_as_fetched).
_fetched = threading.local()


def requeue_message(broker: Broker, message: MessageProxy, *, carry: Mapping[str, Any] | None = None) -> None:
    """Put a fetched message back at the end of its queue as it was fetched (same retries count),
    with the options in ``carry`` added, under a new broker id; the caller then lets the
    original be acknowledged.

    On Redis, in one step and only while this worker still holds it unacknowledged
    (``composition.broker.redis.requeue_as_new``): a drain that already handed it back by id is not
    doubled. Not Redis's own requeue, which keeps the id: a consumer of this same worker may
    fetch it again before the original is acknowledged, and that acknowledgement then deleted
    the body the refetched message still needed (a worker stopping hands the refetched one back
    by id, and found nothing). Elsewhere a copy is enqueued: if the worker dies before the
    acknowledgement, it can run twice (at least once).
    """
    as_fetched: Message[Any] = Message(**{**message.asdict(),
                                          "options": {**options_as_fetched(message), **(carry or {})}})
    redis_id = message.options.get("redis_message_id")
    if isinstance(broker, RedisBroker) and redis_id is not None:
        requeue_as_new(broker, redis_id, as_fetched)
    else:
        broker.enqueue(as_fetched)


def options_as_fetched(message: MessageProxy) -> dict[str, Any]:
    """``message``'s options as they were before this run (the retry bookkeeping changes them),
    or as they are for a message this process did not see start."""
    started: tuple[MessageProxy, dict[str, Any]] | None = getattr(_fetched, "started", None)
    return _copied(started[1] if started is not None and started[0] is message else message.options)


# What decoded JSON holds besides dicts and lists: immutable, so a copy may share them.
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _copied(options: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of a message's options: a tree of dicts, lists and scalars as decoded from
    JSON, copied in a fraction of ``copy.deepcopy``'s time (it runs for every message); any
    other value is deep-copied by ``copy.deepcopy`` still."""
    return {key: value if type(value) in _SCALARS else _copied_value(value) for key, value in options.items()}


def _copied_value(value: Any) -> Any:
    if type(value) is dict:
        return _copied(value)
    if type(value) is list:
        return [item if type(item) in _SCALARS else _copied_value(item) for item in value]
    return copy.deepcopy(value)


class JobRetries(Retries):
    """Dramatiq's Retries with the composition backoff and shutdown requeue (see module doc)."""

    @property
    def actor_options(self) -> set[str]:
        # @job stores its JobPolicy on the actor, for retention and operators' tools, and its
        # payload check and versions, for publish().
        return {*super().actor_options, "job_policy", PAYLOAD_SCHEMA_OPTION, VERSIONS_OPTION}

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        # Deep: a run may change nested options in place (a task appends its worker id).
        _fetched.started = (message, _copied(message.options))

    def _backoff_bounds_ms(self, message: MessageProxy, actor: Any) -> tuple[float, float]:
        """The message's (min, max) backoff, else the actor's, else the middleware's. A bound
        given per message (``send_with_options``) that is not a positive number, or a maximum
        below the minimum, is corrected rather than raised: raised here, in an after-hook,
        Dramatiq would log it and ack the message, neither retried nor dead-lettered."""
        min_ms = (_ms(message.options.get("min_backoff")) or _ms(actor.options.get("min_backoff"))
                  or float(self.min_backoff))
        max_ms = (_ms(message.options.get("max_backoff")) or _ms(actor.options.get("max_backoff"))
                  or float(self.max_backoff))
        return min_ms, max(max_ms, min_ms)

    def _as_retry(self, message: MessageProxy, actor: Any, exception: BaseException) -> BaseException:
        """``exception`` as ``Retries`` is to take it: a permanent one, or a ``Retry`` with a
        delay, as it is; any other as a ``Retry`` delayed by the backoff (recorded in the
        message's options)."""
        throws = message.options.get("throws") or actor.options.get("throws")
        if throws is not None and isinstance(exception, throws):
            return exception
        if isinstance(exception, Retry) and exception.delay is not None:
            delay = exception.delay
            if isinstance(delay, timedelta):  # what it means is plain; Retries adds it to an int
                delay = exception.delay = int(delay.total_seconds() * 1000)
            if isinstance(delay, int | float) and math.isfinite(delay):
                # The job's own delay, recorded as a backoff is: the retry's log line and a
                # scheduled run's lease (composition.schedules.runs) read it from here.
                if _ms(delay) is not None:
                    message.options[BACKOFF_OPTION] = int(delay)
                return exception
            # Retries would raise in its after-hook, and Dramatiq log it and ack the message:
            # neither retried nor dead-lettered. The job's backoff is the delay it gets.
            log.warning("the job's Retry delay is no number of milliseconds; its backoff is used",
                        actor=message.actor_name, message_id=message.message_id, delay=repr(delay)[:100])
        retries = int(message.options.get("retries", 0))
        min_ms, max_ms = self._backoff_bounds_ms(message, actor)
        delay_ms = int(backoff_s(retries, initial_s=min_ms / 1000, max_s=max_ms / 1000) * 1000)
        message.options[BACKOFF_OPTION] = delay_ms
        # Retries takes a Retry's delay as given; the original stays the current exception, so
        # the traceback Retries stores is still the job's own.
        return Retry(exception_text(exception), delay=delay_ms)

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        if exception is None:
            return
        if isinstance(exception, Shutdown):
            _requeue_drained(broker, message)
            return
        message.options.setdefault(FIRST_FAILED_OPTION, current_millis())
        try:
            actor = broker.get_actor(message.actor_name)
        except ActorNotFound:
            # Nothing can run it, however often it is retried; DeadLetters records it.
            message.fail()
            return
        try:
            exception = self._as_retry(message, actor, exception)
        except Exception as exc:
            # Raised here, Dramatiq would log it and acknowledge the message: neither retried nor
            # recorded. Failed, DeadLetters records it.
            log.error("could not schedule the job's retry; the message becomes a dead letter",
                      actor=message.actor_name, message_id=message.message_id, error=described(exc))
            message.fail()
            return
        try:
            super().after_process_message(broker, message, result=result, exception=exception)
        except BROKER_FAILURES as exc:
            if message.failed or not isinstance(exception, Retry) or exception.delay is None:
                raise  # not the retry's enqueue (an on_retry_exhausted send): Dramatiq's case
            _enqueue_retry_or_fail(broker, message, delay_ms=exception.delay, error=exc)


def _ms(value: Any) -> float | None:
    """A positive finite number of milliseconds, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def _enqueue_retry_or_fail(broker: Broker, message: MessageProxy, *, delay_ms: int, error: BaseException) -> None:
    """The broker refused the retry Retries just enqueued: try again a few times; if it still
    refuses, fail the message, so that DeadLetters records it (nothing is acked unrecorded)."""
    last = _tried_again(lambda: broker.enqueue(message, delay=delay_ms), error)  # type: ignore[arg-type]
    if last is None:
        return
    log.error("the broker refused the job's retry; the message becomes a dead letter (replay it "
              "once the broker is back)", actor=message.actor_name, message_id=message.message_id,
              error=described(last))
    message.fail()


def _requeue_drained(broker: Broker, message: MessageProxy) -> None:
    """Hand a drained job back; through a broker blip, try again a few times (on Redis a repeat
    after a lost reply does nothing twice). Failing that it is logged: on Redis the drain's final
    hand-back still returns it if the acknowledgement fails too."""
    try:
        requeue_message(broker, message)
        return
    except BROKER_FAILURES as exc:
        error = _tried_again(lambda: requeue_message(broker, message), exc)
    if error is not None:
        log.critical("could not hand a drained job back to the broker", actor=message.actor_name,
                     message_id=message.message_id, error=described(error))


def _tried_again(send: Callable[[], object], error: BaseException) -> BaseException | None:
    """``send`` again after each of ``RETRY_ENQUEUE_PAUSES_S`` while the broker refuses it; None
    once it is taken, else the last refusal."""
    for pause_s in RETRY_ENQUEUE_PAUSES_S:
        time.sleep(pause_s)
        try:
            send()
            return None
        except BROKER_FAILURES as exc:
            error = exc
    return error
