"""Transactional outbox: ``publish()`` writes a row in the caller's transaction, a relay sends it.

- ``publish(actor, payload, *, key=None, delay_s=None)`` validates and writes an
  ``OutboxMessage``; inside ``transaction.atomic()`` it commits or rolls back with the business
  data, and after commit it nudges the relay;
- the relay (``composition.outbox.relay``) claims pending rows with ``FOR UPDATE SKIP LOCKED``
  and a lease, enqueues them to Dramatiq in one batched round trip and marks them sent;
- ``RelaySweeperComponent`` (``composition.outbox.sweeper``) runs the relay periodically inside
  ``runworkers`` for whatever a nudge missed.
"""

from composition.outbox.errors import (
    InvalidDelayError,
    InvalidKeyError,
    OutboxError,
    PayloadNotSerializableError,
    PayloadTooLargeError,
    PublishError,
    UnknownActorError,
)
from composition.outbox.models import OutboxMessage
from composition.outbox.publish import publish

__all__ = [
    "InvalidDelayError",
    "InvalidKeyError",
    "OutboxError",
    "OutboxMessage",
    "PayloadNotSerializableError",
    "PayloadTooLargeError",
    "PublishError",
    "UnknownActorError",
    "publish",
]
