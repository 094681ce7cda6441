"""Rows the library writes in the caller's transaction, sent with the next statement or COMMIT
rather than in a round trip of their own.

Inside the caller's transaction the library writes rows of its own whose results it does not
need at once: the pending-invalidation record of each invalidated cache key
(``composition.cache.invalidation``) and the outbox row of a ``publish(..., row=False)``
without a key. On the composition database backend (``ENGINE = "composition.db.postgresql"``)
such an INSERT is held and goes out in one string with COMMIT (``"INSERT ...; INSERT ...;
COMMIT"``), or, when another statement comes first, all held ones in one string just before it:
the example's pay costs two round trips fewer.

What this keeps as it was:

- The rows commit or roll back with the caller's data: what is held is sent before any other
  statement on its connection (SAVEPOINT, RELEASE and the caller's own reads included), so it
  lands where it would have, and a read sees it. ROLLBACK, ROLLBACK TO SAVEPOINT (what is
  still held was written inside that savepoint) or closing the connection drops it.
- A held INSERT that fails fails the statement it went with; at COMMIT, Django's ``atomic``
  rolls the whole transaction back and raises, as for any failed COMMIT. Nothing is
  half-written, but the error surfaces later than the call that held it. When that statement
  was another (an inner ``atomic``'s SAVEPOINT, say) and its error was caught, the COMMIT
  raises too, rather than end in the silent ROLLBACK PostgreSQL makes of an aborted
  transaction (``HeldWrites.failed``).
- Only inside a transaction the server has begun: its first statement carries psycopg's BEGIN
  (``composition.begin`` folds it into the caller's first statement), so nothing may go before
  it. Elsewhere, on another backend, with psycopg 2 or server-side binding, callers insert at once.

A held statement may return a row (``RETURNING``), handed to its ``on_row`` once sent: the
rows get their ids from the sequence at the INSERT, in insertion order, as before (the outbox's
relay sends a key's rows, and a transaction's, in id order). Their callers learn the ids after
that, which is why ``publish()`` holds its row only when asked to return none. A callback that
raises after the rows went with COMMIT is logged, not raised: the transaction has committed, and
an exception from ``atomic`` would tell its caller it had not (what the callback was for, the
after-commit send of an outbox row or the deletion of an invalidation record, is left to the
relay's sweep and the invalidation replay).

An UPDATE held with ``hold_update`` must change exactly one row: it checks that itself, in SQL,
and the statement it goes with fails otherwise, with the ``DatabaseError`` Django's
``Model.save(update_fields=...)`` raises for a row that is not there (``composition.deferred_saves``
holds the caller's saves so).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, cast

import structlog
from django.apps import apps
from django.db import DatabaseError, DataError

__all__ = ["HeldWrites", "RowCallback", "can_hold", "hold", "hold_update", "send_held_first"]

log = structlog.get_logger("composition.database")

# Called with the row a held statement returned (RETURNING), once it is sent.
RowCallback = Callable[[tuple[Any, ...]], None]

# Starts the text a held update's check casts to an integer when it did not change one row;
# the error PostgreSQL then raises is turned back into Django's own (``_update_missed``).
_MISSED_UPDATE = "composition: a held update changed no row"


class HeldWrites:
    """The statements held on one connection, already bound (no parameters left), each with what
    to call with the row it returns, if it returns one."""

    def __init__(self) -> None:
        self._statements: list[tuple[str, RowCallback | None]] = []
        # Set when held statements failed going out with another one, so that the transaction
        # is aborted by them: its COMMIT must then fail loudly (see the backend's _commit), not
        # end as the silent ROLLBACK PostgreSQL makes of it, even when the caller caught the
        # error, which came from a statement of its own (say, an inner atomic's SAVEPOINT).
        self.failed = False

    def __bool__(self) -> bool:
        return bool(self._statements)

    def add(self, statement: str, on_row: RowCallback | None = None) -> None:
        self._statements.append((statement, on_row))

    def send(self, cursor: Any, *, then: str = "", past_wrappers: bool = False) -> None:
        """Send everything held on Django ``cursor``, in one string followed by ``then`` (say,
        ``"COMMIT"``), and hand each statement's row to its callback; nothing is held any more,
        whether this succeeds or raises. ``past_wrappers``: not through the connection's execute
        wrappers (see ``send_held_first``); Django's query log still sees the string."""
        statements, self._statements = self._statements, []
        if not statements:
            return
        string = "; ".join([*(sql for sql, _ in statements), *([then] if then else [])])
        try:
            if past_wrappers:
                connection = cursor.db  # per thread, as its wrappers list: nothing else runs on it meanwhile
                wrappers, connection.execute_wrappers = connection.execute_wrappers, []
                try:
                    cursor.execute(string)
                finally:
                    connection.execute_wrappers = wrappers
            else:
                cursor.execute(string)
        except Exception as exc:
            self.failed = True
            missed = _update_missed(exc) if isinstance(exc, DataError) else None
            if missed is None:
                raise
            raise missed from exc
        raw = cursor.cursor  # psycopg's: one result per statement, the first one current
        for index, (sql, on_row) in enumerate(statements):
            if index:
                raw.nextset()
            if on_row is None:
                continue
            try:
                on_row(raw.fetchone())
            except Exception as exc:
                if not then:
                    raise
                # The string ran to its end: ``then`` (COMMIT) has happened. The statement is
                # named by its table only: its bound values are the caller's data.
                log.error("a held statement's row callback failed after its transaction ended; "
                          "its repair takes over", statement=sql.split("(", 1)[0].strip(),
                          error=f"{type(exc).__name__}: {exc}")

    def drop(self) -> None:
        """Forget what is held (the transaction, or the savepoint they were written in, is rolled
        back) and any failure of what was sent (see ``failed``)."""
        self._statements = []
        self.failed = False


def held_writes(connection: Any) -> HeldWrites | None:
    """The held statements of ``connection``, or None when its backend holds none."""
    return getattr(connection, "held_writes", None)


def can_hold(connection: Any) -> bool:
    """Whether a write on ``connection`` may be held now (see the module doc)."""
    if held_writes(connection) is None or not connection.in_atomic_block or connection.needs_rollback:
        return False
    if connection.settings_dict.get("OPTIONS", {}).get("server_side_binding"):
        return False  # the extended protocol takes one statement per call
    pgconn = getattr(connection.connection, "pgconn", None)
    if pgconn is None:  # not connected, or psycopg2
        return False
    from psycopg import pq

    return bool(pgconn.transaction_status == pq.TransactionStatus.INTRANS
                and pgconn.pipeline_status == pq.PipelineStatus.OFF)


def hold(connection: Any, sql: str, params: Any, on_row: RowCallback | None = None) -> None:
    """Hold ``sql`` with ``params`` bound, to go with the next statement or COMMIT of
    ``connection``; only after ``can_hold(connection)`` answered True. A statement that returns
    a row (``RETURNING``) needs ``on_row``, called with it once it is sent."""
    from psycopg import ClientCursor

    writes = held_writes(connection)
    assert writes is not None
    # Bound here, with the connection's adapters, as client-side binding would at execute time.
    writes.add(ClientCursor(connection.connection).mogrify(sql, params), on_row)


def hold_update(connection: Any, sql: str, params: Any, *, model_label: str, pk: Any) -> None:
    """Hold ``sql``, an UPDATE (no RETURNING) of the row ``pk`` of the model ``model_label`` (say
    ``"billing.Invoice"``) that must change exactly that row; only after ``can_hold(connection)``."""
    # The cast of a text that is no number raises; the text depends on count(*), so PostgreSQL
    # cannot fold it (and fail) while planning, whatever the count.
    checked = (f"WITH composition_updated AS ({sql} RETURNING 1) "
               "SELECT CASE count(*) WHEN 1 THEN 1 ELSE "
               f"('{_MISSED_UPDATE}: ' || %s || ' id ' || %s || ' (' || count(*) || ' rows)')::integer END "
               "FROM composition_updated")
    hold(connection, checked, [*params, model_label, str(pk)])


def _update_missed(exc: DataError) -> DatabaseError | None:
    """What ``Model.save(update_fields=...)`` raises (the model's ``NotUpdated`` where Django has
    one), for the error of a held update's check; None for any other error."""
    found = re.search(re.escape(_MISSED_UPDATE) + r": (\S+) id (.*) \((\d+) rows\)", str(exc), re.DOTALL)
    if found is None:
        return None
    label, pk, _ = found.groups()
    try:
        error_class = getattr(apps.get_model(label), "NotUpdated", DatabaseError)  # Django 6
    except (LookupError, ValueError):
        error_class = DatabaseError
    return cast(DatabaseError, error_class(
        f"Save with update_fields did not affect any rows: {label} id {pk}, held for COMMIT; "
        "the transaction is rolled back"))


def send_held_first(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
    """An ``execute_wrapper`` (installed by the composition backend): before any statement, send
    what its connection holds, so the held rows land where they would have.

    They go on a plain cursor of their own, not the caller's: that one may be server-side (a
    ``QuerySet.iterator()``), whose execute is a DECLARE, which cannot carry an INSERT. And they
    go past the execute wrappers inside this one, which are there for the caller's statement: a
    row lock's (``composition.locks.db``) puts its savepoint and lock_timeout around the next
    statement it sees, and must not spend them on the held rows, leaving its lock unbounded
    and, refused, rolling the held rows back with its savepoint."""
    connection = context["connection"]
    writes = held_writes(connection)
    if writes:
        with connection.cursor() as cursor:
            writes.send(cursor, past_wrappers=True)
    return execute(sql, params, many, context)
