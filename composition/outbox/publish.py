"""``publish()``: validate at once, write the outbox row in the caller's transaction, and send it
to the broker right after COMMIT.

The row is inserted already leased to this process's relay (``claims.insert``), so right after
COMMIT this process enqueues it in one broker call and marks it sent, with no database round trip
in between; a row that must wait for an older row of its key is left to the relay. This runs in the
caller's request, so the send goes through a ``CircuitBreaker`` (``NUDGE_BREAKER_RESET_S``): a
broker that is down only delays a message until the relay's next sweep, never fails the commit.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import structlog
from django.db import DEFAULT_DB_ALIAS
from django.utils import timezone
from dramatiq.actor import Actor

from composition.broker.configured import broker_kind, configured_broker
from composition.broker.priorities import MAX_PRIORITY, MIN_PRIORITY, PRIORITY_HEADER, unhonoured_priority
from composition.conf import conf
from composition.db.text import storable_text
from composition.errors import IncompatibleMessageError, PayloadValidationError
from composition.outbox.after_commit import (
    committing_transaction,
    nudge_after_commit,
    send_after_commit,
    under_savepoint,
)
from composition.outbox.claims import ClaimedMessage, Inserted, insert
from composition.outbox.errors import (
    InvalidDelayError,
    InvalidExpiryError,
    InvalidKeyError,
    InvalidPriorityError,
    PayloadDoesNotFitError,
    UnknownActorError,
)
from composition.outbox.held import hold, is_held
from composition.outbox.models import KEY_MAX_LENGTH, OutboxMessage
from composition.outbox.payload_json import check_json, encode_payload, storable_json
from composition.seconds import checked_seconds

__all__ = [
    "EXPIRES_AT_HEADER",
    "IDEMPOTENCY_KEY_HEADER",
    "PAYLOAD_SCHEMA_OPTION",
    "VERSIONS_OPTION",
    "VERSION_HEADER",
    "checked_delay",
    "checked_key",
    "declared_actor",
    "expiry_header",
    "fitting_payload",
    "priority_header",
    "publish",
    "publish_headers",
    "publish_with_headers",
    "read_back",
    "version_header",
]

# The actor option under which ``@job`` leaves its payload check (``jobs.schema.PayloadSchema``,
# anything with ``validate(args, kwargs)``): publish() runs it without importing ``jobs``.
PAYLOAD_SCHEMA_OPTION = "payload_schema"

log = structlog.get_logger("composition.outbox")

# A delay of more than ten years is a mistake (and 1e12 s overflows a date).
MAX_DELAY_S = 10 * 365 * 86_400.0
# Set only by composition.testing.left_to_the_relay(): rows are then written unleased and the
# relay is nudged after COMMIT, for tests that relay them, or watch the relay take them, themselves.
LEFT_TO_THE_RELAY = threading.Event()
# Where a message says the job version its publisher's code declared (none: 1), and the actor
# option holding that job's versions (composition.jobs.versions).
VERSION_HEADER = "job_version"
VERSIONS_OPTION = "job_versions"
# The Unix time after which a message is not to start (``publish(..., expires_s=)``): a worker
# drops it unrun then (composition.jobs.middleware.expiry).
EXPIRES_AT_HEADER = "expires_at"
# The id a replayed message's effects are recorded under in the inbox ledger: its original's.
IDEMPOTENCY_KEY_HEADER = "idempotency_key"
# Headers publish() sets itself; extra headers cannot replace them.
_OWN_HEADERS = frozenset({"request_id", "published_at"})


def publish(actor: Any, payload: Mapping[str, Any], *, key: str | None = None,
            delay_s: float | None = None, priority: int = 0, expires_s: float | None = None) -> OutboxMessage:
    """Write one outbox message for ``actor`` with ``payload`` as its keyword arguments.

    ``actor`` is an actor (anything with an ``actor_name``, such as a Dramatiq actor or a job) or
    an actor name; it must be declared on the configured broker. Inside ``transaction.atomic()``
    the row commits or rolls back with the caller's data; once committed, it is sent to the
    broker at once, and a periodic sweep catches anything that missed. Messages with the same
    ``key`` are relayed in publish order. ``delay_s`` (seconds after publish) delays the job; over
    ``OUTBOX_HELD_DELAY_S`` the row waits in the outbox until due (``composition.outbox.held``).
    ``priority`` (-100..100, higher first) orders it among the messages waiting in its queue.
    ``expires_s`` (seconds after publish) drops it unrun if no worker has started it by then.

    Raises ``UnknownActorError``, ``PayloadNotSerializableError`` (not a dict with string keys
    of JSON values, or text PostgreSQL cannot store: a NUL character, a lone surrogate),
    ``PayloadTooLargeError`` (above ``OUTBOX_MAX_PAYLOAD_BYTES`` encoded),
    ``InvalidKeyError``, ``InvalidDelayError``, ``InvalidPriorityError`` or
    ``InvalidExpiryError``; all are ``PublishError``/``ValueError``.

    Returns the row as it was inserted, without reading it again: pending, even once sent (the
    send after COMMIT, or at once outside a transaction, updates the table, not this object;
    ``refresh_from_db()`` reads where it is).
    """
    headers = {**priority_header(priority), **expiry_header(expires_s, checked_delay(delay_s))}
    return publish_with_headers(actor, payload, headers=headers, key=key, delay_s=delay_s)


def publish_with_headers(actor: Any, payload: Mapping[str, Any], *, headers: Mapping[str, Any],
                         key: str | None = None, delay_s: float | None = None) -> OutboxMessage:
    """``publish()`` with extra message headers (JSON values under string keys) that travel in
    the Dramatiq message's ``options["composition"]``, such as the idempotency key of a replayed
    dead letter. The request id and publish time are always publish's own. Raises like
    ``publish()``, and ``PayloadNotSerializableError`` for headers that are not JSON.
    """
    declared = declared_actor(actor)
    name = declared.actor_name
    extra = {header: value for header, value in headers.items() if header not in _OWN_HEADERS}
    check_json(extra, "headers")
    extra.update(version_header(declared, extra))
    encoded = fitting_payload(declared, payload, extra.get(VERSION_HEADER))
    key = checked_key(key)
    delay_s = checked_delay(delay_s)
    all_headers = publish_headers(extra)
    headers_json = storable_json(all_headers, "headers").decode()
    created_at = timezone.now()
    if is_held(delay_s):
        assert delay_s is not None
        committing_transaction("publish()")  # refuses manual transaction management, as below
        [row] = hold(actor_name=name, queue_name=declared.queue_name, payloads=[json.loads(encoded)], key=key,
                     headers=json.loads(headers_json), delay_s=delay_s, created_at=created_at)
        return row
    if LEFT_TO_THE_RELAY.is_set():
        inserted = insert(actor_name=name, queue_name=declared.queue_name, payload_json=encoded.decode(), key=key,
                          headers_json=headers_json, delay_s=delay_s, created_at=created_at)
        nudge_after_commit()
        return read_back(inserted, name, declared.queue_name, payload, key, all_headers, delay_s, created_at, "")
    in_transaction = committing_transaction("publish()")
    send, relay = send_after_commit(in_transaction)
    # The row is inserted leased to this process's relay (unless its key must wait), so that the
    # send after COMMIT needs no claim: see composition.outbox.claims.
    claim_for = relay.relay_id if send.relay is relay else None
    since = time.monotonic()
    savepoint = under_savepoint()

    inserted = insert(actor_name=name, queue_name=declared.queue_name, payload_json=encoded.decode(), key=key,
                      headers_json=headers_json, delay_s=delay_s, created_at=created_at, lease_s=relay.lease_s,
                      claim_for=claim_for, own_ids=send.claimed_by_key.get(key, ()) if key is not None else ())
    send.ids.append(inserted.id)
    if inserted.claimed_until is not None:
        # Decoded again: the caller may change its payload before COMMIT, the row cannot.
        send.add_claimed(ClaimedMessage(
            id=inserted.id, actor_name=name, queue_name=declared.queue_name, payload=json.loads(encoded),
            key=key, headers=json.loads(headers_json), delay_s=delay_s, created_at=created_at,
        ), since=since, under_savepoint=savepoint)
    if not in_transaction:
        send()  # autocommit: the row is committed already
    return read_back(inserted, name, declared.queue_name, payload, key, all_headers, delay_s, created_at,
                     claim_for if inserted.claimed_until is not None else "")


# -- the steps publish() and publish_many() share ---------------------------------------------------
def declared_actor(actor: Any) -> Actor[..., Any]:
    """The actor declared on the configured broker under ``actor``'s name (``actor`` is an actor,
    anything with an ``actor_name``, or a name); raises ``UnknownActorError``."""
    name = _actor_name(actor)
    # The registry, not get_actor(): a worker's broker answers unknown names with a stand-in.
    declared: Actor[..., Any] | None = configured_broker().actors.get(name)
    if declared is None:
        raise UnknownActorError(name)
    return declared


def fitting_payload(declared: Actor[..., Any], payload: Any, version: Any = None) -> bytes:
    """``payload`` encoded (``encode_payload``), once it fits ``declared``'s arguments (at
    ``version``, upgraded as a worker would, when it is an older one than the job's); raises the
    publish errors, ``PayloadDoesNotFitError`` for a payload that does not fit."""
    encoded = encode_payload(payload)
    schema = declared.options.get(PAYLOAD_SCHEMA_OPTION)
    versions = declared.options.get(VERSIONS_OPTION)  # a composition.jobs.versions.JobVersions
    try:
        if versions is not None and version is not None:
            versions.fit(schema, (), payload, version)
        elif schema is not None:
            schema.validate((), payload)
    except IncompatibleMessageError as exc:
        raise PayloadDoesNotFitError(exc.reason) from None
    except PayloadValidationError as exc:
        raise PayloadDoesNotFitError(str(exc)) from None
    return encoded


def version_header(declared: Actor[..., Any], headers: Mapping[str, Any]) -> dict[str, Any]:
    """The version header a message of ``declared`` is published with: the one in ``headers``
    (a replay keeps its original's), else the job's own when above 1 (a message saying none is
    of version 1)."""
    if VERSION_HEADER in headers:
        return {VERSION_HEADER: headers[VERSION_HEADER]}
    versions = declared.options.get(VERSIONS_OPTION)
    return {VERSION_HEADER: versions.version} if versions is not None and versions.version > 1 else {}


def checked_key(key: Any) -> str | None:
    """``key`` when it is None or a usable ordering key; raises ``InvalidKeyError``."""
    if key is not None and (not isinstance(key, str) or not key or len(key) > KEY_MAX_LENGTH):
        raise InvalidKeyError(f"key must be a non-empty string of at most {KEY_MAX_LENGTH} characters, "
                              f"got {key!r}")
    if key is not None and not storable_text(key):
        # PostgreSQL would refuse it at the INSERT, aborting the caller's transaction.
        raise InvalidKeyError(f"key must be text PostgreSQL can store (no NUL, no lone surrogate), got {key!r}")
    return key


def checked_delay(delay_s: Any) -> float | None:
    """``delay_s`` as seconds (a float), or None; raises ``InvalidDelayError``."""
    if delay_s is None:
        return None
    try:
        return checked_seconds("delay_s", delay_s, at_most=MAX_DELAY_S, zero=True)
    except ValueError as exc:
        raise InvalidDelayError(str(exc)) from None


def priority_header(priority: Any) -> dict[str, int]:
    """The header a message of ``priority`` is published with (none for 0); raises
    ``InvalidPriorityError`` for anything but a whole number from -100 to 100, and for one the
    configured broker would not honour."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidPriorityError(f"priority must be a whole number from {MIN_PRIORITY} to {MAX_PRIORITY} "
                                   f"(higher runs first), got {priority!r}")
    if priority == 0:
        return {}  # every broker honours the default: no settings to read on the usual publish
    problem = unhonoured_priority(priority, broker=broker_kind(str(conf.BROKER_URL)),
                                  queue_type=conf.RABBITMQ_QUEUE_TYPE, max_priority=conf.RABBITMQ_MAX_PRIORITY)
    if problem is not None:
        raise InvalidPriorityError(problem)
    return {PRIORITY_HEADER: priority} if priority else {}


def expiry_header(expires_s: Any, delay_s: float | None) -> dict[str, float]:
    """The header of a message that expires ``expires_s`` seconds from now (none for None);
    raises ``InvalidExpiryError`` for anything but seconds above 0, and for an expiry not after
    the message's ``delay_s`` (it could never run)."""
    if expires_s is None:
        return {}
    try:
        seconds = checked_seconds("expires_s", expires_s, at_most=MAX_DELAY_S)
    except ValueError as exc:
        raise InvalidExpiryError(str(exc)) from None
    if delay_s is not None and seconds <= delay_s:
        raise InvalidExpiryError(f"expires_s ({seconds:g}) is not after delay_s ({delay_s:g}): the job would expire "
                                 "before it is due")
    return {EXPIRES_AT_HEADER: time.time() + seconds}


def publish_headers(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The headers of a message published now: ``extra`` (checked JSON), the request id and the
    publish time (Unix seconds)."""
    context = structlog.contextvars.get_contextvars()
    return {**extra, "request_id": context.get("request_id"), "published_at": time.time()}


def read_back(inserted: Inserted, actor_name: str, queue_name: str, payload: Mapping[str, Any], key: str | None,
              headers: dict[str, Any], delay_s: float | None, created_at: datetime,
              claimed_by: str | None) -> OutboxMessage:
    """The model instance of a row just inserted, as if read back."""
    values = {"id": inserted.id, "actor_name": actor_name, "queue_name": queue_name, "payload": dict(payload),
              "key": key, "headers": headers, "delay_s": delay_s, "status": OutboxMessage.Status.PENDING.value,
              "created_at": created_at, "claimed_until": inserted.claimed_until, "claimed_by": claimed_by or "",
              "attempts": 1 if inserted.claimed_until is not None else 0, "sent_at": None, "last_error": "",
              "due_at": None, "reconciled_after_loss": None}
    # from_db: the positional fast path of Model.__init__, and the instance's state set as for a row read back.
    names = _field_names()
    return OutboxMessage.from_db(DEFAULT_DB_ALIAS, names, [values[name] for name in names])


@functools.cache
def _field_names() -> list[str]:
    return [field.attname for field in OutboxMessage._meta.concrete_fields]


def _actor_name(actor: Any) -> str:
    if isinstance(actor, str):
        return actor
    name = getattr(actor, "actor_name", None)
    if isinstance(name, str):
        return name
    raise UnknownActorError(repr(actor), not_an_actor=True)
