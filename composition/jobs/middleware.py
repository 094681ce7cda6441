"""The old import path of the job middleware; it only re-exports.

The middleware that did everything here is now one concern per module, in the broker's stack
(``composition.jobs.stack``): ``retries`` (backoff and shutdown requeue), ``in_flight`` (the
registry the heartbeat and the drain read), ``observability`` (context, metrics),
``dead_lettering``, ``unknown_actors``, and Dramatiq's own ``CurrentMessage``
(``composition.jobs.current``). ``JobMiddleware`` and ``find_job_middleware`` now name the
in-flight registry, the part callers looked the old middleware up for (``state()``,
``in_flight()``).
"""

from __future__ import annotations

from composition.jobs.current import attempt_of, current_message
from composition.jobs.dead_lettering import DEAD_LETTER_OPTION, DEAD_LETTER_RETRY_DELAYS_S
from composition.jobs.in_flight import InFlight, InFlightRegistry
from composition.jobs.retries import BACKOFF_OPTION, JobRetries, requeue_message
from composition.jobs.stack import find_in_flight, job_middleware

__all__ = [
    "BACKOFF_OPTION",
    "DEAD_LETTER_OPTION",
    "DEAD_LETTER_RETRY_DELAYS_S",
    "InFlight",
    "JobMiddleware",
    "JobRetries",
    "attempt_of",
    "current_message",
    "find_job_middleware",
    "job_middleware",
    "requeue_message",
]

JobMiddleware = InFlightRegistry
find_job_middleware = find_in_flight
