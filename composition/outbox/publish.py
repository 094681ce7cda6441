"""``publish()``: validate at once, write the outbox row in the caller's transaction, and send it
to the broker right after COMMIT.

One hop from commit to broker: right after the transaction commits, the committing process
claims the rows it just published with the relay's own claim (the same lease, the same
oldest-row-per-key rule), enqueues them in one broker call and marks them sent, conditional on
still holding them. So no polled step sits between COMMIT and the broker, and the relay is not
raced: a row the committing process sends is leased, so no relay sends it too, and a row it
cannot take (an older row of its key is still pending, or the process dies first) is left
pending for the relay, which a nudge wakes and the sweep covers.

This runs in the caller's request, so it must never make the request pay for a broker that is
down or frozen: each broker's after-commit sends go through a ``CircuitBreaker`` that, after one
failure, skips them for ``NUDGE_BREAKER_RESET_S``. A skipped or failed send only delays a
message until the relay's next sweep; it never turns the caller's commit into an exception.
"""

from __future__ import annotations

import json
import math
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

import structlog
from django.db import DEFAULT_DB_ALIAS, transaction
from dramatiq.broker import Broker
from dramatiq.errors import ActorNotFound, BrokerError

from composition.breaker import CircuitBreaker, CircuitOpen
from composition.broker import configured_broker
from composition.conf import conf
from composition.outbox.errors import (
    InvalidDelayError,
    InvalidKeyError,
    PayloadNotSerializableError,
    PayloadTooLargeError,
    UnknownActorError,
)
from composition.outbox.models import KEY_MAX_LENGTH, OutboxMessage
from composition.outbox.relay import relay_actor, relay_for
from composition.redis_errors import REDIS_ERRORS
from composition.transactions import on_commit_once

__all__ = ["encode_payload", "nudge_breaker", "publish", "publish_with_headers"]

log = structlog.get_logger("composition.outbox")

# Deepest nesting a payload may have; payloads are meant to be a few ids, and the limit keeps the
# validation walk from recursing without bound.
_MAX_DEPTH = 32
# The key of the one after-commit send per transaction (see on_commit_once).
_SEND_KEY = "composition.outbox.send_after_commit"
_NUDGE_KEY = "composition.outbox.nudge"
# What opens the breaker: the broker failing. A database error of the after-commit send (a
# restarting PostgreSQL) says nothing about the broker and must not pause sends that would work.
BROKER_FAILURES: tuple[type[BaseException], ...] = (BrokerError, *REDIS_ERRORS)
# One failed nudge opens the broker's nudge circuit: a frozen broker then costs one socket
# timeout per NUDGE_BREAKER_RESET_S for the whole process, not one per commit.
NUDGE_BREAKER_FAILURES = 1
NUDGE_BREAKER_RESET_S = 5.0
# Headers publish() sets itself; extra headers cannot replace them.
_OWN_HEADERS = frozenset({"request_id", "published_at"})


def publish(actor: Any, payload: Mapping[str, Any], *, key: str | None = None,
            delay_s: float | None = None) -> OutboxMessage:
    """Write one outbox message for ``actor`` with ``payload`` as its keyword arguments.

    ``actor`` is an actor (anything with an ``actor_name``, such as a Dramatiq actor or a job) or
    an actor name; it must be declared on the configured broker. Inside ``transaction.atomic()``
    the row commits or rolls back with the caller's data; once committed, it is sent to the
    broker at once (``OUTBOX_SEND_ON_COMMIT``; else the relay is nudged), and a periodic sweep
    catches anything that missed. Messages with the same ``key``
    are relayed in publish order. ``delay_s`` (seconds after publish) delays the job.

    Raises ``UnknownActorError``, ``PayloadNotSerializableError`` (not a dict with string keys
    of JSON values), ``PayloadTooLargeError`` (above ``OUTBOX_MAX_PAYLOAD_BYTES`` encoded),
    ``InvalidKeyError`` or ``InvalidDelayError``; all are ``PublishError``/``ValueError``.
    """
    return publish_with_headers(actor, payload, headers={}, key=key, delay_s=delay_s)


def publish_with_headers(actor: Any, payload: Mapping[str, Any], *, headers: Mapping[str, Any],
                         key: str | None = None, delay_s: float | None = None) -> OutboxMessage:
    """``publish()`` with extra message headers (JSON values under string keys) that travel in
    the Dramatiq message's ``options["composition"]``, such as the idempotency key of a replayed
    dead letter. The request id and publish time are always publish's own. Raises like
    ``publish()``, and ``PayloadNotSerializableError`` for headers that are not JSON.
    """
    name = _actor_name(actor)
    try:
        declared = configured_broker().get_actor(name)
    except ActorNotFound:
        raise UnknownActorError(name) from None
    encode_payload(payload)
    if key is not None and (not isinstance(key, str) or not key or len(key) > KEY_MAX_LENGTH):
        raise InvalidKeyError(f"key must be a non-empty string of at most {KEY_MAX_LENGTH} characters, "
                              f"got {key!r}")
    if delay_s is not None:
        if isinstance(delay_s, bool) or not isinstance(delay_s, int | float) or not math.isfinite(delay_s) \
                or delay_s < 0:
            raise InvalidDelayError(f"delay_s must be a finite number of seconds >= 0, got {delay_s!r}")
        delay_s = float(delay_s)
    extra = {header: value for header, value in headers.items() if header not in _OWN_HEADERS}
    _check_json(extra, "headers", 0)
    context = structlog.contextvars.get_contextvars()
    message = OutboxMessage.objects.create(
        actor_name=name, queue_name=declared.queue_name, payload=dict(payload), key=key,
        headers={**extra, "request_id": context.get("request_id"), "published_at": time.time()},
        delay_s=delay_s,
    )
    if not conf.OUTBOX_SEND_ON_COMMIT:
        # A transaction publishing thousands of rows needs one nudge, not thousands.
        on_commit_once(_NUDGE_KEY, _nudge, using=DEFAULT_DB_ALIAS)
    elif transaction.get_connection(DEFAULT_DB_ALIAS).in_atomic_block:
        # One send after COMMIT for the whole transaction, however many rows it publishes.
        send = on_commit_once(_SEND_KEY, _SendAfterCommit(), using=DEFAULT_DB_ALIAS)
        send.ids.append(message.pk)
    else:
        _SendAfterCommit([message.pk])()  # autocommit: the row is committed already
    return message


def encode_payload(payload: Any) -> bytes:
    """The payload as compact UTF-8 JSON; raises the publish errors for a bad or oversize payload."""
    if not isinstance(payload, Mapping):
        raise PayloadNotSerializableError(
            f"payload must be a dict of keyword arguments, got {type(payload).__name__}")
    _check_json(payload, "payload", 0)
    encoded = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    limit = int(conf.OUTBOX_MAX_PAYLOAD_BYTES)
    if len(encoded) > limit:
        raise PayloadTooLargeError(len(encoded), limit)
    return encoded


def _check_json(value: Any, path: str, depth: int) -> None:
    # json.dumps alone would turn {1: "a"} into {"1": "a"} and a tuple into a list without a word,
    # and the job would receive something else than what was published; refuse instead.
    if depth > _MAX_DEPTH:
        raise PayloadNotSerializableError(f"{path} is nested deeper than {_MAX_DEPTH} levels")
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadNotSerializableError(f"{path} is {value!r}, which JSON cannot represent")
        return
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_json(item, f"{path}[{index}]", depth + 1)
        return
    if isinstance(value, Mapping):
        for item_key, item in value.items():
            if not isinstance(item_key, str):
                raise PayloadNotSerializableError(f"{path} has a non-string key {item_key!r}")
            _check_json(item, f"{path}[{item_key!r}]", depth + 1)
        return
    raise PayloadNotSerializableError(
        f"{path} is a {type(value).__name__}, which is not JSON; pass ids and plain values")


def _actor_name(actor: Any) -> str:
    if isinstance(actor, str):
        return actor
    name = getattr(actor, "actor_name", None)
    if isinstance(name, str):
        return name
    raise UnknownActorError(repr(actor))


_breakers_lock = threading.Lock()
_breakers: weakref.WeakKeyDictionary[Broker, CircuitBreaker] = weakref.WeakKeyDictionary()


def nudge_breaker(broker: Broker) -> CircuitBreaker:
    """The circuit breaker of ``broker``'s relay nudges in this process (one per broker)."""
    with _breakers_lock:
        breaker = _breakers.get(broker)
        if breaker is None:
            breaker = CircuitBreaker("outbox_nudge", failure_threshold=NUDGE_BREAKER_FAILURES,
                                     reset_timeout_s=NUDGE_BREAKER_RESET_S, failure_types=BROKER_FAILURES)
            _breakers[broker] = breaker
        return breaker


class _SendAfterCommit:
    """The rows one transaction published, sent to the broker once it has committed."""

    def __init__(self, ids: list[int] | None = None) -> None:
        self.ids: list[int] = ids if ids is not None else []

    def __call__(self) -> None:
        """Never raises: the caller's commit has succeeded whatever happens here."""
        try:
            broker = configured_broker()
            sent = nudge_breaker(broker).call(relay_for(broker).relay_published, self.ids)
        except CircuitOpen as exc:
            log.debug("outbox send after commit skipped, the broker is failing; the sweep will relay it",
                      retry_after_s=round(exc.retry_after_s, 2))
            return
        except Exception as exc:
            log.warning("outbox send after commit failed; the sweep will relay it",
                        error=f"{type(exc).__name__}: {exc}")
            return
        if len(sent) < len(self.ids):
            # Rows that wait behind an older row of their key (or were rolled back with a
            # savepoint): the relay takes the key's rows in order once its head has gone.
            _nudge()


def _nudge() -> None:
    """Ask the relay to run now, through the broker's nudge breaker; never raises. After commit the
    row is safe and a failed nudge only delays it until the next sweep, so it must never turn the
    caller's successful commit into an exception."""
    try:
        broker = configured_broker()
        nudge_breaker(broker).call(relay_actor(broker).send)
    except CircuitOpen as exc:
        log.debug("outbox relay nudge skipped, the broker is failing; the sweep will relay the message",
                  retry_after_s=round(exc.retry_after_s, 2))
    except Exception as exc:
        log.warning("outbox relay nudge failed; the sweep will relay the message",
                    error=f"{type(exc).__name__}: {exc}")
