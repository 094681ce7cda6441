"""The broker's middleware stack: Dramatiq's defaults with the job middleware in place.

``job_middleware()`` is what ``composition.broker`` builds every broker with. In place of
Dramatiq's ``Retries`` it puts, in this order (before-hooks run in list order, after-hooks in
reverse):

1. ``CurrentMessage`` (Dramatiq's own): ``composition.jobs.current_message()``.
2. ``MessageContext``: connection hygiene and log context, around everything below.
3. ``UnknownActors``: dead-letters what the consumer rejects for an undeclared actor.
4. ``DeadLetters``: writes the dead letter, after the outcome is decided and counted.
5. ``JobMetrics``: counts and logs the outcome.
6. ``InFlightRegistry``: takes the run off the in-flight table first, so the drain never
   interrupts a dead-letter write.
7. ``JobRetries``: its after-hook decides retry or failure before any of the above reads it.

Dramatiq's ``ShutdownNotifications`` is replaced by ``JobShutdownNotifications`` (its interrupt
goes through the time-limit watchdog), and its ``TimeLimit`` by
``composition.time_limits.JobTimeLimit``, placed last: armed after every other before-hook,
disarmed before any other after-hook runs. Just before it,
``InterruptedQueries`` cancels a query an interrupt lands in, and closes a connection it could
not free, before the bookkeeping above needs the database.
"""

from __future__ import annotations

from typing import TypeVar

from dramatiq.broker import Broker
from dramatiq.middleware import (
    CurrentMessage,
    Middleware,
    Retries,
    ShutdownNotifications,
    TimeLimit,
    default_middleware,
)

from composition.jobs.dead_lettering import DeadLetters
from composition.jobs.in_flight import InFlightRegistry
from composition.jobs.interrupted_queries import InterruptedQueries
from composition.jobs.observability import JobMetrics, MessageContext
from composition.jobs.retries import JobRetries
from composition.jobs.unknown_actors import UnknownActors
from composition.time_limits import JobShutdownNotifications, JobTimeLimit

__all__ = ["find_in_flight", "find_middleware", "job_middleware"]

M = TypeVar("M", bound=Middleware)


def job_middleware() -> list[Middleware]:
    """A new middleware list for one broker, in the order the module doc explains."""
    stack: list[Middleware] = []
    for middleware_class in default_middleware:
        if middleware_class is Retries:
            in_flight = InFlightRegistry()
            stack += [CurrentMessage(), MessageContext(), UnknownActors(), DeadLetters(in_flight),
                      JobMetrics(in_flight), in_flight, JobRetries()]
        elif middleware_class is TimeLimit:
            continue  # JobTimeLimit goes last, so its after-hook disarms the limit first
        elif middleware_class is ShutdownNotifications:
            stack.append(JobShutdownNotifications())
        else:
            stack.append(middleware_class())
    return [*stack, InterruptedQueries(), JobTimeLimit()]


def find_middleware(broker: Broker, kind: type[M]) -> M | None:
    """The first middleware of ``broker`` that is a ``kind``, or None."""
    for middleware in broker.middleware:
        if isinstance(middleware, kind):
            return middleware
    return None


def find_in_flight(broker: Broker) -> InFlightRegistry | None:
    """The in-flight registry of ``broker`` (heartbeat ``state()``, drain ``in_flight()``), or
    None for a broker built without the job middleware."""
    return find_middleware(broker, InFlightRegistry)
