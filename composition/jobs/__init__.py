"""Jobs: Dramatiq actors with a retry policy, dead letters and an inbox ledger.

``@job(...)`` declares an actor; raise ``PermanentError`` (never retried, dead-lettered at once)
or ``TransientError`` (retried with backoff) to choose a failure's path; inside a job,
``current_message()`` is the message being run.

The package, module by module:

- ``decorator``: ``@job``; ``policy``: ``JobPolicy`` and ``backoff_s``; ``schema``: payload
  validation against the function's signature.
- ``inbox``: the ledger an ``idempotent=True`` job commits with; ``models``: ``DeadLetter`` and
  ``ProcessedMessage``; ``deadletters``: writing a dead letter row; ``replay``: the operator's
  replay, discard and ``filter_dead_letters``; ``admin``: their admin screens.
- The worker middleware, one concern each, assembled by ``stack.job_middleware()``:
  ``current`` (Dramatiq's ``CurrentMessage``), ``retries``, ``in_flight``, ``observability``,
  ``dead_lettering``, ``unknown_actors``; ``middleware`` is their old import path.
- ``runtime``: a worker process's drain and broker keepalive.
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
