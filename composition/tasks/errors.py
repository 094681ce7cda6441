"""The errors of the ``django.tasks`` backend, each also the ``django.tasks`` error callers expect.

- ``InvalidBackendOptions``: the backend's ``QUEUES`` or ``OPTIONS`` are unusable (an
  ``InvalidTaskBackend`` and our ``ConfigurationError``), raised when the backend is built.
- ``InvalidTaskArguments``: ``enqueue()`` arguments that no run could accept (an ``InvalidTask``
  and a ``TypeError``, what Django's own backends raise). Nothing is written.
- ``InvalidTaskReturnValue``: a run returned what cannot be kept (not JSON, or over
  ``TASK_RETURN_VALUE_MAX_BYTES``): a ``PermanentError`` and a ``TypeError``.
"""

from __future__ import annotations

from composition.errors import CompositionError, ConfigurationError, PermanentError
from composition.tasks._compat import InvalidTask, InvalidTaskBackend

__all__ = ["InvalidBackendOptions", "InvalidTaskArguments", "InvalidTaskReturnValue"]


class InvalidBackendOptions(ConfigurationError, InvalidTaskBackend):
    """``TASKS[alias]`` of an ``OutboxBackend`` has a bad queue name or option (the message names
    it); raised when the backend is built (by ``@task`` at import, or at start)."""

    def __init__(self, alias: str, problem: str) -> None:
        super().__init__(f"TASKS[{alias!r}] (composition.tasks.OutboxBackend): {problem}")
        self.alias = alias


class InvalidTaskArguments(CompositionError, InvalidTask, TypeError):
    """A task was enqueued with arguments it could never run with; nothing was written."""


class InvalidTaskReturnValue(PermanentError, TypeError):
    """A task returned a value its result cannot keep (the message says why). Permanent: the run
    fails for good at once (no retry would return anything else) and, ``ATOMIC``, its effects
    roll back; a ``TypeError``, what Django's own backends fail such a run with."""
