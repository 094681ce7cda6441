"""Jobs: Dramatiq actors with a retry policy, dead letters and an inbox ledger.

``@job(...)`` declares an actor; ``PermanentError`` (dead-lettered at once) or ``TransientError``
(retried with backoff) chooses a failure's path; ``current_message()`` is the message being run.
Modules: ``decorator``, ``policy``, ``schema``; ``inbox``, ``models``, ``deadletters``, ``replay``
(the ledger and dead letters); ``middleware/``, the worker middleware, one concern per module;
``current``, ``connection_hygiene``, ``recent_counts`` (what it uses); ``runtime`` (a worker
process's drain and broker keepalive); ``broker_losses`` and ``shortfalls`` (a Redis broker
that lost messages, told and reconciled from the ledger).
"""

from composition.errors import PayloadValidationError, PermanentError, TransientError
from composition.jobs.current import current_message
from composition.jobs.decorator import job
from composition.jobs.policy import JobPolicy, backoff_s

__all__ = [
    "JobPolicy",
    "PayloadValidationError",
    "PermanentError",
    "TransientError",
    "backoff_s",
    "current_message",
    "job",
]
