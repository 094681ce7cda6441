"""The message a worker thread is running: ``current_message()`` and ``attempt_of()``.

``current_message()`` reads Dramatiq's own ``CurrentMessage`` middleware, which
``composition.jobs.middleware.stack.job_middleware()`` puts in the broker's stack; it is None outside a
job. ``@job(idempotent=True)`` keys its inbox ledger row on it.
"""

from __future__ import annotations

from typing import cast

from dramatiq.broker import MessageProxy
from dramatiq.middleware import CurrentMessage

__all__ = ["attempt_of", "current_message"]


def current_message() -> MessageProxy | None:
    """The message the calling worker thread is running, or None outside a job (or on a broker
    whose stack lacks Dramatiq's ``CurrentMessage``)."""
    # Dramatiq's worker hands its middleware a MessageProxy; CurrentMessage types it as a Message.
    return cast("MessageProxy | None", CurrentMessage.get_current_message())


def attempt_of(message: MessageProxy) -> int:
    """Which run of the message this is, from 1 (Dramatiq counts retries, from 0)."""
    return int(message.options.get("retries", 0)) + 1
