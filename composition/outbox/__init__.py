"""Transactional outbox: ``publish()`` writes a row in the caller's transaction, a relay sends it.

``publish(actor, payload, *, key=None, delay_s=None, priority=0, expires_s=None)`` checks the payload against the job
(``PayloadDoesNotFitError``) and writes an ``OutboxMessage`` that commits or rolls back with the
business data, sent right after commit; ``publish_many`` does the same for a list, and ``cancel``
takes back a job no relay tried to send. Modules: ``publish``, ``publish_many``, ``cancel``, ``payload_json``
(a payload as JSON jsonb stores as it is), ``models``, ``claims`` (claim, mark-sent and release
statements), ``relay`` (claim, ``enqueue`` in one round trip, mark sent), ``relay_actor``, ``sweeper``
(``RelaySweeperComponent``, for what a nudge missed, and held rows that came due), ``held`` (a delay
over ``OUTBOX_HELD_DELAY_S`` waits in the outbox, not the broker), ``maintenance`` (status, gauges, pruning).
"""

from composition.outbox.cancel import cancel
from composition.outbox.errors import (
    InvalidDelayError,
    InvalidExpiryError,
    InvalidKeyError,
    InvalidPriorityError,
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
    "InvalidExpiryError",
    "InvalidKeyError",
    "InvalidPriorityError",
    "OutboxError",
    "OutboxMessage",
    "PayloadDoesNotFitError",
    "PayloadNotSerializableError",
    "PayloadTooLargeError",
    "PublishError",
    "UnknownActorError",
    "cancel",
    "publish",
    "publish_many",
]
