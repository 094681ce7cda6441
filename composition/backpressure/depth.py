"""How much work a queue holds, defined once (``backlog``): its pending outbox rows plus every
message the broker holds for it, ready, delayed and (Redis) taken but not yet acked. Admission,
the sampler's gauge and the operations page all count with it. ``queue_depth`` measures now;
``QueueDepths`` keeps a process's measurements for admission, the broker behind a breaker.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import structlog
from dramatiq.broker import Broker

from composition.breaker import CircuitBreaker, CircuitOpen
from composition.broker.configured import configured_broker
from composition.broker.keys import dq_name, lanes_key, messages_key, queue_key
from composition.errors import described
from composition.metrics import QUEUE_DEPTH

__all__ = ["BrokerCounts", "QueueDepths", "backlog", "broker_counts", "queue_depth"]

log = structlog.get_logger("composition.backpressure")


@dataclass(frozen=True)
class BrokerCounts:
    """What the broker holds for one queue: ready to run, delayed (retries waiting for their
    backoff, and messages with an eta), and taken by a worker but not yet acked (Redis only:
    RabbitMQ's passive declare does not count them; None there).

    On RabbitMQ, ready and delayed count only what no consumer holds: a running worker fetches
    ahead (its prefetch), and holds a delayed message until it is due, so while workers run a
    backlog of retries can read as 0 there. Backpressure on RabbitMQ sees what waits beyond the
    workers' prefetch, and the outbox's pending rows."""

    ready: int
    delayed: int
    in_flight: int | None


def backlog(outbox_pending: int, counts: BrokerCounts | None) -> int:
    """A queue's depth: ``outbox_pending`` rows plus the broker's ``counts`` (a broker that could
    not be asked, None, counts as empty: the outbox then holds the backlog)."""
    if counts is None:
        return outbox_pending
    return outbox_pending + counts.ready + counts.delayed + (counts.in_flight or 0)


def broker_counts(queue: str, broker: Broker | None = None) -> BrokerCounts:
    """The broker's counts for ``queue`` on ``broker`` (default: the configured one): one round
    trip on Redis, two passive declares on RabbitMQ. Raises the broker's error."""
    broker = broker if broker is not None else configured_broker()
    client = getattr(broker, "client", None)
    if client is not None:
        namespace = getattr(broker, "namespace", "dramatiq")
        pipe = client.pipeline(transaction=False)
        pipe.llen(queue_key(namespace, queue))
        pipe.zcard(lanes_key(namespace, queue))  # ready too, with a priority
        pipe.hlen(messages_key(namespace, queue))  # the ready ones and those taken, not yet acked
        pipe.hlen(messages_key(namespace, dq_name(queue)))
        listed, laned, bodies, delayed = (int(value) for value in pipe.execute())
        ready = listed + laned
        return BrokerCounts(ready=ready, delayed=delayed, in_flight=max(0, bodies - ready))
    return BrokerCounts(ready=_rabbitmq_count(broker, queue), delayed=_rabbitmq_count(broker, dq_name(queue)),
                        in_flight=None)


def _rabbitmq_count(broker: Broker, queue: str, *, again: bool = True) -> int:
    """The message count of a passive declare on the thread's channel; 0 for a queue no one has
    declared yet. A failed declare closes the channel (RabbitMQ's way with a 404) or came from a
    broken connection: either is dropped, as Dramatiq does, so the thread's next read opens a
    fresh one instead of failing on a closed channel from then on (and counting as empty).

    A connection found closed is read through a fresh one at once (``again``): an idle thread's
    connection sends no heartbeats, so RabbitMQ closes it as a matter of course, and failing the
    read would open the depth breaker, blinding backpressure for its reset period."""
    import pika.exceptions

    try:
        return int(broker.channel.queue_declare(queue, passive=True).method.message_count)  # type: ignore[attr-defined]
    except pika.exceptions.ChannelClosedByBroker as exc:
        del broker.channel  # type: ignore[attr-defined]
        if exc.reply_code == 404:
            return 0
        raise
    except pika.exceptions.ChannelError:
        del broker.channel  # type: ignore[attr-defined]
        raise
    except (pika.exceptions.AMQPConnectionError, pika.exceptions.ConnectionWrongStateError, OSError):
        del broker.connection  # type: ignore[attr-defined]  # and its channel
        if again:
            return _rabbitmq_count(broker, queue, again=False)
        raise
    except Exception:
        del broker.connection  # type: ignore[attr-defined]  # and its channel
        raise


def _outbox_depth(queue: str) -> int:
    # Late: this module (and composition.backpressure.admission, which imports it) must be importable
    # before Django's app registry is ready, and importing a model needs it.
    from composition.outbox.models import OutboxMessage

    return int(OutboxMessage.objects.filter(status="pending", queue_name=queue).count())


def queue_depth(queue: str, *, broker_breaker: CircuitBreaker | None = None) -> int:
    """The backlog of ``queue``: pending outbox rows plus the broker's messages.

    A broker that cannot be asked (or whose ``broker_breaker`` is open) counts as empty: the
    outbox then holds the backlog, and that is still counted. The failure is logged. Database
    errors propagate.
    """
    pending = _outbox_depth(queue)
    counts: BrokerCounts | None = None
    try:
        counts = broker_counts(queue) if broker_breaker is None else broker_breaker.call(broker_counts, queue)
    except CircuitOpen:
        pass
    except Exception as exc:
        log.warning("could not read the broker's queue depth", queue=queue, error=str(exc))
    measured = backlog(pending, counts)
    QUEUE_DEPTH.labels(queue).set(measured)
    return measured


class QueueDepths:
    """Per-process depths, refreshed when older than ``max_age_s`` by one thread at a time (the
    others keep answering with the previous value), with the broker behind a breaker so a frozen
    broker costs one socket timeout per ``BROKER_RESET_S``, not one per request."""

    BROKER_RESET_S = 5.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, tuple[float, int]] = {}
        self._refreshing: dict[str, threading.Lock] = {}
        self._breaker: CircuitBreaker | None = None

    def _broker_breaker(self) -> CircuitBreaker:
        if self._breaker is None:
            self._breaker = CircuitBreaker("backpressure-broker-depth", failure_threshold=1,
                                           reset_timeout_s=self.BROKER_RESET_S)
        return self._breaker

    def _fresh(self, queue: str, max_age_s: float) -> tuple[float, int] | None:
        with self._lock:
            cached = self._values.get(queue)
        if cached is not None and time.monotonic() - cached[0] < max_age_s:
            return cached
        return None

    def get(self, queue: str, *, max_age_s: float) -> int:
        """The depth of ``queue`` measured at most ``max_age_s`` seconds ago; while another thread
        refreshes it, the previous measurement (the first measurement is waited for). A
        measurement that fails (the database) leaves the previous one standing, or 0."""
        fresh = self._fresh(queue, max_age_s)
        if fresh is not None:
            return fresh[1]
        with self._lock:
            cached = self._values.get(queue)
            refreshing = self._refreshing.setdefault(queue, threading.Lock())
        if not refreshing.acquire(blocking=cached is None):
            return cached[1] if cached is not None else 0  # another thread is measuring
        try:
            fresh = self._fresh(queue, max_age_s)  # measured by the thread we waited for
            if fresh is not None:
                return fresh[1]
            try:
                depth = queue_depth(queue, broker_breaker=self._broker_breaker())
            except Exception as exc:
                # Admission must not fail a request for it, nor ask a struggling database again on
                # every request: the last measurement (none yet: admitted) stands for max_age_s.
                log.warning("could not measure the queue's depth; the last measurement stands", queue=queue,
                            error=described(exc))
                depth = cached[1] if cached is not None else 0
            with self._lock:
                self._values[queue] = (time.monotonic(), depth)
            return depth
        finally:
            refreshing.release()

    def clear(self) -> None:
        """Forget every measurement and the broker breaker's state."""
        with self._lock:
            self._values.clear()
            self._breaker = None
