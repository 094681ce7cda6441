"""Jobs: Dramatiq actors with a retry policy, dead letters and an inbox ledger.

``@job(...)`` declares an actor; raise ``PermanentError`` (never retried, dead-lettered at once)
or ``TransientError`` (retried with backoff) to choose a failure's path. Dead letters and the
inbox ledger are ``composition.jobs.models.DeadLetter`` and ``ProcessedMessage``; replay and
discard are in ``composition.jobs.replay``.
"""

from composition.errors import PayloadValidationError, PermanentError, TransientError
from composition.jobs.decorator import job
from composition.jobs.middleware import current_message
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
