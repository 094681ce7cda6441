"""Rows the library writes in the caller's transaction, sent with COMMIT rather than in a round
trip of their own.

Inside the caller's transaction the library writes rows of its own whose results it does not
need before COMMIT once their ids are known ahead (``reserve_id``): today the pending-invalidation
record of each invalidated cache key (``composition.cache.invalidation``). On the composition
database backend (``ENGINE = "composition.db.postgresql"``) such an INSERT is held and goes out
with the connection's next statement or with COMMIT, in one string (``"INSERT ...; COMMIT"``):
a pay that invalidates its invoice's cache entry costs a round trip fewer.

What this keeps as it was:

- The rows commit or roll back with the caller's data: what is held is sent before any other
  statement on its connection (SAVEPOINT, ROLLBACK TO SAVEPOINT and the caller's own reads
  included), so it lands where it would have, and a read sees it. ROLLBACK or closing the
  connection drops what is still held.
- A held INSERT that fails fails the statement it went with; at COMMIT, Django's ``atomic``
  rolls the whole transaction back and raises, as for any failed COMMIT. Nothing is
  half-written, but the error surfaces later than the call that held it.
- Only inside a transaction the server has begun: its first statement carries psycopg's BEGIN
  (``composition.begin`` folds it into the caller's first statement), so nothing may go before
  it. Elsewhere, on another backend, or with server-side binding, callers insert at once.

Ids come from the table's own sequence in blocks of ``ID_BLOCK`` per process and table, one
round trip per block, so they no longer follow insertion order across processes. That is why
the outbox's rows are not held: the relay sends the rows of a key, and those of one
transaction, in id order. A block is dropped after ``ID_BLOCK_MAX_AGE_S``, so that a sequence
reset under a running process (``TRUNCATE ... RESTART IDENTITY``) can collide only with ids
reserved just before it; such a collision fails the caller's COMMIT rather than losing anything.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db.models import Model

__all__ = ["ID_BLOCK", "ID_BLOCK_MAX_AGE_S", "HeldWrites", "can_hold", "hold", "reserve_id", "send_held_first"]

ID_BLOCK = 50
ID_BLOCK_MAX_AGE_S = 60.0


class HeldWrites:
    """The statements held on one connection, already bound (no parameters left)."""

    def __init__(self) -> None:
        self._statements: list[str] = []

    def __bool__(self) -> bool:
        return bool(self._statements)

    def add(self, statement: str) -> None:
        self._statements.append(statement)

    def take(self) -> str | None:
        """Everything held, as one string, and nothing held any more; None when nothing was."""
        if not self._statements:
            return None
        statements, self._statements = self._statements, []
        return "; ".join(statements)

    def drop(self) -> None:
        self._statements = []


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


def hold(connection: Any, sql: str, params: Any) -> None:
    """Hold ``sql`` with ``params`` bound, to go with the next statement or COMMIT of
    ``connection``; only after ``can_hold(connection)`` answered True. The statement must not
    return rows."""
    from psycopg import ClientCursor

    writes = held_writes(connection)
    assert writes is not None
    # Bound here, with the connection's adapters, as client-side binding would at execute time.
    writes.add(ClientCursor(connection.connection).mogrify(sql, params))


def send_held_first(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
    """An ``execute_wrapper`` (installed by the composition backend): before any statement, send
    what its connection holds, so the held rows land where they would have."""
    connection = context["connection"]
    held = held_writes(connection).take()  # type: ignore[union-attr]
    if held is not None:
        cursor = context["cursor"]
        if cursor is None:  # a caller that sends without a cursor (composition.jobs.inbox)
            with connection.cursor() as own:
                own.execute(held)
        else:
            cursor.execute(held)
    return execute(sql, params, many, context)


class _IdBlocks:
    """Ids reserved from tables' sequences, per process: (alias, table) -> (ids, reserved at)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.blocks: dict[tuple[str, str], tuple[list[int], float]] = {}

    def forget(self) -> None:
        # A forked child must not hand out the ids its parent holds too.
        self.lock = threading.Lock()
        self.blocks = {}

    def take(self, connection: Any, model: type[Model]) -> int:
        key = (connection.alias, model._meta.db_table)
        now = time.monotonic()
        with self.lock:
            ids, reserved_at = self.blocks.get(key, ([], now))
            if ids and now - reserved_at < ID_BLOCK_MAX_AGE_S:
                return ids.pop()
        fresh = self._reserve(connection, model)
        with self.lock:
            self.blocks[key] = (fresh[:-1], now)
        return fresh[-1]

    @staticmethod
    def _reserve(connection: Any, model: type[Model]) -> list[int]:
        table = connection.ops.quote_name(model._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
                           [table, model._meta.pk.column, ID_BLOCK])
            # Handed out from the end: the smallest first.
            return sorted((int(row[0]) for row in cursor.fetchall()), reverse=True)


_id_blocks = _IdBlocks()
os.register_at_fork(after_in_child=_id_blocks.forget)


def reserve_id(connection: Any, model: type[Model]) -> int:
    """An id of ``model``'s sequence on ``connection`` that no other row will take: from this
    process's block, or a new block (one round trip)."""
    return _id_blocks.take(connection, model)
