"""Errors raised by the outbox.

``publish()`` validates its input at once, so a bad call fails in the caller's code path with
a clear message instead of becoming a message no worker can run. Every publish error is also a
``ValueError`` (or a ``LookupError`` for an unknown actor), so generic handlers still catch it.
"""

from __future__ import annotations

from collections.abc import Sequence

from dramatiq.errors import BrokerConnectionError, BrokerError

from composition.errors import CompositionError

__all__ = [
    "ConfirmTimeout",
    "InvalidDelayError",
    "InvalidExpiryError",
    "InvalidKeyError",
    "InvalidPriorityError",
    "MessagesRejected",
    "OutboxError",
    "PayloadDoesNotFitError",
    "PayloadNotSerializableError",
    "PayloadTooLargeError",
    "PublishError",
    "UnknownActorError",
]


class OutboxError(CompositionError):
    """Base class of the outbox's errors."""


class PublishError(OutboxError, ValueError):
    """``publish()`` was called with input that can never become a valid message."""


class UnknownActorError(PublishError, LookupError):
    """The actor is neither an actor object nor the name of an actor declared on the broker."""

    def __init__(self, actor_name: str, *, not_an_actor: bool = False) -> None:
        super().__init__(
            f"{actor_name} is not a job: publish() takes a function declared with @job (or a Dramatiq "
            "actor), or its name" if not_an_actor else
            f"unknown actor {actor_name!r}: no actor of that name is declared on the configured "
            "broker (is its app's jobs module imported?)"
        )
        self.actor_name = actor_name


class PayloadNotSerializableError(PublishError, TypeError):
    """The payload is not a dict of JSON-serializable keyword arguments."""


class PayloadDoesNotFitError(PublishError, TypeError):
    """The payload does not fit the job's arguments (a missing or unexpected name, a value of
    another JSON type than the one annotated): it could only fail in the worker, so it is
    refused before anything is written."""


class PayloadTooLargeError(PublishError):
    """The JSON-encoded payload exceeds ``COMPOSITION["OUTBOX_MAX_PAYLOAD_BYTES"]``."""

    def __init__(self, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(
            f"payload is {size_bytes} bytes encoded, above OUTBOX_MAX_PAYLOAD_BYTES={limit_bytes}; "
            "send ids and let the job load the data"
        )
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class InvalidKeyError(PublishError):
    """The ordering key is not a non-empty string of at most 255 characters."""


class InvalidDelayError(PublishError):
    """``delay_s`` is negative, not finite or not a number."""


class InvalidExpiryError(PublishError):
    """``expires_s`` is not a number of seconds above 0, or not after ``delay_s``."""


class InvalidPriorityError(PublishError):
    """``priority`` is not a whole number from -100 to 100, or the configured broker would not
    honour it (RabbitMQ quorum queues, or classic ones without ``RABBITMQ_MAX_PRIORITY``)."""


# -- delivery to RabbitMQ (composition.outbox.rabbitmq) ----------------------------------------
class MessagesRejected(OutboxError, BrokerError):
    """RabbitMQ nacked or returned messages of a batch (``nacked`` and ``returned`` of ``total``);
    the others of the batch may have been enqueued."""

    def __init__(self, *, total: int, nacked: int, returned: Sequence[str]) -> None:
        reasons = []
        if nacked:
            reasons.append(f"{nacked} nacked (a full queue with x-overflow=reject-publish, or a broker error)")
        if returned:
            reasons.append(f"{len(returned)} returned unroutable ({', '.join(sorted(set(returned)))})")
        super().__init__(f"RabbitMQ refused {nacked + len(returned)} of {total} messages: {'; '.join(reasons)}")
        self.total = total
        self.nacked = nacked
        self.returned = list(returned)


class ConfirmTimeout(OutboxError, BrokerConnectionError):
    """RabbitMQ confirmed only part of a batch within the timeout (``unconfirmed`` of ``total``)."""

    def __init__(self, *, total: int, unconfirmed: int, timeout_s: float) -> None:
        super().__init__(f"RabbitMQ confirmed {total - unconfirmed} of {total} messages within {timeout_s:g} s")
        self.total = total
        self.unconfirmed = unconfirmed
