"""PostgreSQL locks: ``row_lock`` (SELECT ... FOR UPDATE) and ``advisory_lock``
(pg_advisory_xact_lock). Both are transaction-scoped and need an open ``transaction.atomic()``.

A lock that may fail (``nowait``, ``timeout_s``) is taken so that a refusal leaves the caller's
transaction usable (``composition.locks.savepoint``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from uuid import UUID

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Manager, Model, QuerySet

from composition.locks.errors import LockNotAcquired, TransactionRequired
from composition.locks.savepoint import can_send_at_once, in_savepoint, row_lock_at_once
from composition.metrics import LOCK_ACQUIRE, LOCK_HOLD_SECONDS, LOCK_TIMEOUTS_TOTAL, LOCK_WAIT_SECONDS
from composition.seconds import checked_seconds

__all__ = ["advisory_key", "advisory_lock", "row_lock"]

M = TypeVar("M", bound=Model)

# PostgreSQL's lock_timeout holds at most 2**31 - 1 ms (24.8 days); a day of waiting is a mistake.
MAX_TIMEOUT_S = 86_400.0
_SEPARATOR = "\x1f"  # between namespace and key in an advisory key's hashed text


def advisory_key(namespace: str, key: int | str | UUID) -> int:
    """The signed 64-bit advisory lock id of (namespace, key): blake2b, so it is the same in every
    process (Python's ``hash()`` is salted per process). ``42`` and ``"42"`` are the same key.

    Raises TypeError/ValueError unless ``namespace`` is a non-empty string without the separator
    character ``\x1f`` and ``key`` an int, a non-empty string or a UUID: anything else (None, a
    model instance, whose text may change with its fields) would name a lock by accident.
    """
    if not isinstance(namespace, str) or not namespace or _SEPARATOR in namespace:
        raise ValueError(f"an advisory lock namespace is a non-empty string without \\x1f, got {namespace!r}")
    if isinstance(key, bool) or not isinstance(key, int | str | UUID):
        raise TypeError(f"an advisory lock key is an int, a string or a UUID, got {key!r} "
                        "(for a row, its primary key)")
    if key == "":
        raise ValueError("an advisory lock key cannot be an empty string")
    digest = hashlib.blake2b(f"{namespace}{_SEPARATOR}{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _require_transaction(alias: str, what: str) -> Any:
    connection = connections[alias]
    if not connection.in_atomic_block:
        raise TransactionRequired(
            f"{what} must run inside transaction.atomic(using={alias!r}); the lock is released when "
            "that transaction ends, so outside one it would be released at once")
    return connection


def _record(kind: str, label: str, outcome: str, started: float) -> None:
    LOCK_ACQUIRE.labels(kind, label, outcome).inc()
    LOCK_WAIT_SECONDS.labels(kind, label).observe(time.monotonic() - started)


@contextmanager
def _held(kind: str, label: str) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        LOCK_HOLD_SECONDS.labels(kind, label).observe(time.monotonic() - started)


@contextmanager
def row_lock(queryset: QuerySet[M], *, nowait: bool = False, skip_locked: bool = False,
             timeout_s: float | None = None) -> Iterator[list[M]]:
    """Lock the rows of ``queryset`` (SELECT ... FOR UPDATE) until the transaction ends; yields them.

    - ``nowait`` (or ``timeout_s=0``): raise LockNotAcquired at once if a row is locked;
    - ``timeout_s``: wait at most this many seconds, then raise LockNotAcquired (sooner when the
      session's statement_timeout is shorter: it ends the wait);
    - ``skip_locked``: lock and yield only the rows nobody else holds (never raises for a busy row).

    After LockNotAcquired the caller's transaction is still usable and ``lock_timeout`` is what it
    was. Raises TypeError for anything but a QuerySet (a model instance: pass
    ``Model.objects.filter(pk=...)``), TransactionRequired outside ``transaction.atomic()``, ValueError for ``nowait``
    together with ``skip_locked`` or ``timeout_s``. The lock name (and metric label) is the
    model's label, e.g. ``billing.Invoice``.
    """
    if isinstance(queryset, Manager):
        queryset = queryset.all()  # Invoice.objects: every row, as select_for_update() on it takes
    if not isinstance(queryset, QuerySet):
        # An instance (row_lock(order)) failed on its missing .model, naming nothing.
        example = f"{type(queryset).__name__}.objects.filter(pk=...)" if isinstance(queryset, Model) else \
            "Invoice.objects.filter(pk=...)"
        raise TypeError(f"row_lock takes a QuerySet of the rows to lock, e.g. {example}; got "
                        f"{type(queryset).__name__} {queryset!r:.100}")
    if skip_locked and (nowait or timeout_s is not None):
        raise ValueError("skip_locked cannot be combined with nowait or timeout_s")
    if nowait and timeout_s not in (None, 0):
        raise ValueError(f"nowait does not wait: it cannot be combined with timeout_s={timeout_s!r}")
    if timeout_s is not None:
        timeout_s = checked_seconds("timeout_s", timeout_s, at_most=MAX_TIMEOUT_S, zero=True)
    if timeout_s == 0:
        nowait, timeout_s = True, None
    name = queryset.model._meta.label
    locking = queryset.select_for_update(nowait=nowait, skip_locked=skip_locked)
    # The locking query's database (the router's for writes), not the queryset's for reads.
    connection = _require_transaction(locking.db, "row_lock")
    started = time.monotonic()
    try:
        if nowait or timeout_s is not None:
            take = row_lock_at_once if can_send_at_once(connection) else in_savepoint
            rows = take(connection, name, timeout_s, lambda: list(locking))
        else:
            rows = list(locking)
    except LockNotAcquired:
        _record("row", name, "busy", started)
        if timeout_s is not None:  # waited the whole timeout, unlike a nowait refusal
            LOCK_TIMEOUTS_TOTAL.labels("row", name).inc()
        raise
    _record("row", name, "acquired", started)
    with _held("row", name):
        yield rows


@contextmanager
def advisory_lock(namespace: str, key: int | str | UUID, *, timeout_s: float | None = None, shared: bool = False,
                  using: str | None = None) -> Iterator[int]:
    """Take the transaction-scoped advisory lock of (namespace, key); yields its 64-bit id.

    The lock is held until the enclosing transaction commits or rolls back (also when the body
    raises), not merely until the with-block ends. ``timeout_s=None`` waits (bounded by the
    session's statement_timeout); ``0`` tries once; a positive value waits that many seconds (at
    most the statement_timeout, which then ends the wait with LockNotAcquired).
    ``shared`` takes the shared variant (many shared holders, no exclusive one). Raises
    LockNotAcquired (name ``"namespace:key"``) when not obtained, leaving the transaction usable;
    TransactionRequired outside ``transaction.atomic()``. The metric label is ``namespace``.
    """
    if timeout_s is not None:
        timeout_s = checked_seconds("timeout_s", timeout_s, at_most=MAX_TIMEOUT_S, zero=True)
    connection = _require_transaction(using or DEFAULT_DB_ALIAS, "advisory_lock")
    lock_id = advisory_key(namespace, key)
    suffix = "_shared" if shared else ""
    started = time.monotonic()
    if timeout_s is None:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT pg_advisory_xact_lock{suffix}(%s)", [lock_id])
    elif timeout_s == 0:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT pg_try_advisory_xact_lock{suffix}(%s)", [lock_id])
            got = cursor.fetchone()[0]
        if not got:
            _record("advisory", namespace, "busy", started)
            raise LockNotAcquired(f"{namespace}:{key}", "busy (try once)")
    else:
        def take() -> None:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT pg_advisory_xact_lock{suffix}(%s)", [lock_id])

        try:
            in_savepoint(connection, f"{namespace}:{key}", timeout_s, take)
        except LockNotAcquired:
            _record("advisory", namespace, "busy", started)
            LOCK_TIMEOUTS_TOTAL.labels("advisory", namespace).inc()  # waited timeout_s, unlike a try-once
            raise
    _record("advisory", namespace, "acquired", started)
    with _held("advisory", namespace):
        yield lock_id
