"""The job middleware, one concern per module, in the order ``stack.job_middleware()`` builds
them around Dramatiq's own: ``paused_queues`` (first: hands back a paused queue's message),
``expiry`` (drops a message past its expiry), ``limited_starts`` (a job's concurrency and rate
limits, waiting through ``put_backs``; ``quiet_skips`` keeps put-backs out of Dramatiq's
warnings), ``message_context`` (connections, log context), ``unknown_actors``,
``run_signals`` (``job_run_started``, ``job_run_ended``), ``dead_letters``, ``job_metrics``,
``in_flight`` (the registry the heartbeat and the drain read), ``retries`` (backoff and shutdown
requeue) and ``interrupted_queries``. Invariant: every way a job ends passes through them, so it
is counted, logged and, failed for good, dead-lettered.
"""

from composition.jobs.middleware.dead_letters import DeadLetters
from composition.jobs.middleware.expiry import Expiry
from composition.jobs.middleware.in_flight import InFlight, InFlightRegistry
from composition.jobs.middleware.interrupted_queries import InterruptedQueries
from composition.jobs.middleware.job_metrics import JobMetrics
from composition.jobs.middleware.limited_starts import LimitedStarts
from composition.jobs.middleware.message_context import MessageContext
from composition.jobs.middleware.paused_queues import PausedQueues
from composition.jobs.middleware.retries import JobRetries
from composition.jobs.middleware.run_signals import FOLLOW_RUNS_HEADER, RunSignals, job_run_ended, job_run_started
from composition.jobs.middleware.stack import find_in_flight, job_middleware
from composition.jobs.middleware.unknown_actors import UnknownActors

__all__ = ["FOLLOW_RUNS_HEADER", "DeadLetters", "Expiry", "InFlight", "InFlightRegistry", "InterruptedQueries",
           "JobMetrics", "JobRetries", "LimitedStarts", "MessageContext", "PausedQueues", "RunSignals", "UnknownActors",
           "find_in_flight", "job_middleware", "job_run_ended", "job_run_started"]
