"""A PostgreSQL lock that may be refused (``nowait``, ``timeout_s``), taken so that the refusal
leaves the caller's transaction usable: inside a savepoint, with ``lock_timeout`` set locally and
restored after. ``row_lock`` sends all of that as one statement string, one round trip instead of
five (psycopg 3 with client-side binding): it sits on the request path of every locked write.
What a changer must keep: after LockNotAcquired the transaction goes on, its ``lock_timeout`` as
it was.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

from django.db import DatabaseError, OperationalError, transaction

from composition.locks.errors import LockNotAcquired

__all__ = ["can_send_at_once", "in_savepoint", "row_lock_at_once"]

T = TypeVar("T")

_LOCK_NOT_AVAILABLE = "55P03"  # SQLSTATE of both NOWAIT failures and lock_timeout expiries
# SQLSTATE of a statement cancelled: by statement_timeout when it is shorter than timeout_s, or by a
# cancel request. Either way the lock was not obtained, and the savepoint keeps the transaction usable.
_QUERY_CANCELED = "57014"
# row_lock's own savepoint (released before row_lock returns, so nesting cannot clash), and the
# transaction-local placeholder setting that carries lock_timeout's previous value from the
# statement that sets it to the one that restores it, within one statement string.
_ROW_LOCK_SAVEPOINT = "composition_row_lock"
_PREVIOUS_LOCK_TIMEOUT = "composition.lock_timeout_before"


def _timeout_ms(timeout_s: float) -> str:
    return f"{max(1, round(timeout_s * 1000))}ms"


def _lock_refused(name: str, timeout_s: float | None, exc: OperationalError) -> LockNotAcquired | None:
    sqlstate = getattr(exc.__cause__, "sqlstate", None)
    if sqlstate == _QUERY_CANCELED and timeout_s is not None:
        return LockNotAcquired(name, f"the wait was cancelled before {timeout_s}s (statement_timeout is shorter, "
                                     "or a cancel request)")
    if sqlstate != _LOCK_NOT_AVAILABLE:
        return None
    reason = "busy (nowait)" if timeout_s is None else f"not free within {timeout_s}s"
    return LockNotAcquired(name, reason)


def can_send_at_once(connection: Any) -> bool:
    """Whether ``connection`` takes several statements in one string and can step through their
    results: psycopg 3 with client-side binding (Django's default), which uses the simple query
    protocol. Server-side binding (extended protocol) allows one statement per call."""
    if connection.vendor != "postgresql" or connection.settings_dict.get("OPTIONS", {}).get("server_side_binding"):
        return False
    from django.db.backends.postgresql.psycopg_any import is_psycopg3  # imports the driver in use

    return bool(is_psycopg3)


def _nothing_sent_yet(connection: Any) -> bool:
    """True when the transaction of ``connection`` has not reached the server yet: psycopg 3
    sends BEGIN with the first statement, so the server's side is still idle (and the outermost
    ``atomic`` holds no savepoint)."""
    if connection.savepoint_ids:
        return False
    connection.ensure_connection()
    from psycopg import pq  # only reached with psycopg 3

    return bool(connection.connection.info.transaction_status == pq.TransactionStatus.IDLE)


class _OneRoundTrip:
    """An ``execute_wrapper`` that sends ``before`` and ``after`` with the next statement, as
    one string (PostgreSQL's simple protocol runs them in order and stops at the first error),
    and leaves the cursor on that statement's result. Every part is a constant without ``%``,
    so the statement's own parameters bind as they would alone."""

    def __init__(self, before: list[str], after: list[str]) -> None:
        self.before = before
        self.after = after
        self.sent = False
        self.failed = False

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool,
                 context: dict[str, Any]) -> Any:
        if self.sent or many:
            return execute(sql, params, many, context)
        self.sent = True
        try:
            result = execute("; ".join([*self.before, sql, *self.after]), params, many, context)
        except Exception:
            self.failed = True
            raise
        cursor = context["cursor"].cursor
        for _ in self.before:
            cursor.nextset()
        return result


def row_lock_at_once(connection: Any, name: str, timeout_s: float | None, take: Callable[[], T]) -> T:
    """``in_savepoint`` in one round trip (PostgreSQL with psycopg 3; see the module doc):
    ``take`` runs the locking query, which goes out with the savepoint and timeout statements."""
    # As the transaction's first statement it needs no savepoint: a failure rolls back a
    # transaction that held nothing, and the caller's next statement begins it again.
    whole = _nothing_sent_yet(connection)
    before: list[str] = [] if whole else [f'SAVEPOINT "{_ROW_LOCK_SAVEPOINT}"']
    after: list[str] = []
    if timeout_s is not None:
        before.append(f"SELECT set_config('{_PREVIOUS_LOCK_TIMEOUT}', current_setting('lock_timeout'), true), "
                      f"set_config('lock_timeout', '{_timeout_ms(timeout_s)}', true)")
        after.append(f"SELECT set_config('lock_timeout', current_setting('{_PREVIOUS_LOCK_TIMEOUT}'), true)")
    if not whole:
        after.append(f'RELEASE SAVEPOINT "{_ROW_LOCK_SAVEPOINT}"')
    statement = _OneRoundTrip(before, after)
    try:
        with connection.execute_wrapper(statement):
            return take()
    except DatabaseError as exc:
        if not statement.failed:
            raise
        # The statement string stopped at its error: undo what it began, so the caller's
        # transaction is as it was (its lock_timeout too). An undo that fails (a broken
        # connection) leaves the original error to tell.
        with suppress(Exception):
            if whole:
                connection.connection.rollback()
            else:
                with connection.cursor() as cursor:
                    cursor.execute(f'ROLLBACK TO SAVEPOINT "{_ROW_LOCK_SAVEPOINT}"; '
                                   f'RELEASE SAVEPOINT "{_ROW_LOCK_SAVEPOINT}"')
        refused = _lock_refused(name, timeout_s, exc) if isinstance(exc, OperationalError) else None
        if refused is not None:
            raise refused from exc
        raise


def in_savepoint(connection: Any, name: str, timeout_s: float | None, take: Callable[[], T]) -> T:
    """Run ``take`` in a savepoint with ``lock_timeout`` = ``timeout_s``; LockNotAcquired when it
    cannot get its lock. Any other error propagates (the savepoint is rolled back either way)."""
    try:
        with transaction.atomic(using=connection.alias):
            previous = None
            if timeout_s is not None:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)",
                                   [_timeout_ms(timeout_s)])
                    previous = cursor.fetchone()[0]
            result = take()
            if previous is not None:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])
            return result
    except OperationalError as exc:
        refused = _lock_refused(name, timeout_s, exc)
        if refused is not None:
            raise refused from exc
        raise
