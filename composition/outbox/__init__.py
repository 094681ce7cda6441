"""Transactional outbox: ``publish()`` writes a row in the caller's transaction, a relay sends it.

- ``publish(actor, payload, *, key=None, delay_s=None)`` (``publish``) validates (the payload
  against the job's arguments too: ``PayloadDoesNotFitError``) and writes an
  ``OutboxMessage`` (``models``); inside ``transaction.atomic()`` it commits or rolls back with
  the business data, and after commit it nudges the relay; ``publish_many(actor, payloads, *,
  key=None, delay_s=None)`` (``publish_many``) does the same for a list of payloads, all checked
  before one INSERT per thousand rows;
- ``claims``: the claim (``FOR UPDATE SKIP LOCKED`` with a lease), mark-sent and release
  statements, each its own short transaction;
- ``relay``: the loop that claims, enqueues to Dramatiq in one batched round trip
  (``enqueue``) and marks sent; ``relay_actor``: the actor a nudge runs;
- ``sweeper``: ``RelaySweeperComponent`` runs the relay periodically inside ``runworkers`` for
  whatever a nudge missed;
- ``maintenance``: status, the pending gauges and pruning of sent rows.
"""

from composition.outbox.errors import (
    InvalidDelayError,
    InvalidKeyError,
    OutboxError,
    PayloadDoesNotFitError,
    PayloadNotSerializableError,
    PayloadTooLargeError,
    PublishError,
    UnknownActorError,
)
from composition.outbox.models import OutboxMessage
from composition.outbox.publish import publish
from composition.outbox.publish_many import publish_many

__all__ = [
    "InvalidDelayError",
    "InvalidKeyError",
    "OutboxError",
    "OutboxMessage",
    "PayloadDoesNotFitError",
    "PayloadNotSerializableError",
    "PayloadTooLargeError",
    "PublishError",
    "UnknownActorError",
    "publish",
    "publish_many",
]
