"""The broker's middleware stack: Dramatiq's defaults with the job middleware in place.

``PausedQueues`` comes first (it hands back a paused queue's message before anything else runs
for it), then ``Expiry`` (a message past its expiry is dropped unrun), then ``LimitedStarts``; in
place of ``Retries``, ``job_middleware()`` puts the job middleware; ``JobShutdownNotifications``
replaces Dramatiq's; ``InterruptedQueries`` and ``JobTimeLimit`` go last, so the limit is armed
after every other before-hook and disarmed before any after-hook.
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

from composition.broker.time_limits import JobShutdownNotifications, JobTimeLimit
from composition.jobs.middleware.dead_letters import DeadLetters
from composition.jobs.middleware.expiry import Expiry
from composition.jobs.middleware.in_flight import InFlightRegistry
from composition.jobs.middleware.interrupted_queries import InterruptedQueries
from composition.jobs.middleware.job_metrics import JobMetrics
from composition.jobs.middleware.limited_starts import LimitedStarts
from composition.jobs.middleware.message_context import MessageContext
from composition.jobs.middleware.paused_queues import PausedQueues
from composition.jobs.middleware.quiet_skips import quiet_put_backs
from composition.jobs.middleware.retries import JobRetries
from composition.jobs.middleware.run_signals import RunSignals
from composition.jobs.middleware.unknown_actors import UnknownActors

__all__ = ["find_in_flight", "find_middleware", "job_middleware"]

M = TypeVar("M", bound=Middleware)


def job_middleware() -> list[Middleware]:
    """A new middleware list for one broker, in the order the module doc explains."""
    # In place of Retries (before-hooks run in list order, after-hooks in reverse): CurrentMessage,
    # MessageContext (log context around all below), UnknownActors, RunSignals (job_run_started;
    # job_run_ended once the dead letter is written), DeadLetters (after the outcome is decided
    # and counted), JobMetrics, InFlightRegistry (so the drain never interrupts a dead-letter
    # write), JobRetries (decides first). Neither PausedQueues', Expiry's nor LimitedStarts' skip is
    # logged as Dramatiq's warning (quiet_skips).
    quiet_put_backs()
    stack: list[Middleware] = [PausedQueues(), Expiry(), LimitedStarts()]
    for middleware_class in default_middleware:
        if middleware_class is Retries:
            in_flight = InFlightRegistry()
            stack += [CurrentMessage(), MessageContext(), UnknownActors(), RunSignals(), DeadLetters(in_flight),
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
