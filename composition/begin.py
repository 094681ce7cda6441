"""A transaction's BEGIN sent with its first statement, in one string: one round trip fewer.

psycopg 3 opens a transaction lazily: before the first statement after ``atomic()`` it sends
its own BEGIN and waits for the answer, a round trip that carries nothing. Where the library
itself sends a transaction's first statement on a hot path (``row_lock``'s lock, the inbox
ledger's INSERT), ``begin_sql`` says which BEGIN psycopg would send (with the connection's
isolation level and access mode), and the caller sends ``BEGIN; <statement>`` as one string
(PostgreSQL's simple query protocol runs both and stops at the first error). Afterwards the
connection is inside the transaction exactly as after psycopg's own BEGIN; COMMIT and ROLLBACK
go through Django as usual.

This reads psycopg's internals (``Connection._autocommit``, the flag its lazy BEGIN looks at,
and ``pgconn``): when they are missing ``begin_sql`` answers None and the caller takes the
ordinary path. tests/test_locks.py and tests/test_inbox.py count the round trips, so a psycopg
that changes them under the same names fails there, loudly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["begin_sql", "sending_own_begin"]


def begin_sql(connection: Any) -> str | None:
    """The BEGIN psycopg is about to send on its own before the next statement of Django's
    ``connection``, or None when it is not (autocommit, a transaction already under way, a
    savepoint open, not PostgreSQL with psycopg 3 and its internals)."""
    if connection.vendor != "postgresql" or not connection.in_atomic_block or connection.savepoint_ids:
        return None
    try:
        from psycopg import IsolationLevel, pq
    except ImportError:  # psycopg2
        return None
    connection.ensure_connection()
    raw = connection.connection
    if (not hasattr(raw, "pgconn") or not isinstance(getattr(raw, "_autocommit", None), bool)
            or raw._autocommit
            or raw.pgconn.transaction_status != pq.TransactionStatus.IDLE
            or raw.pgconn.pipeline_status != pq.PipelineStatus.OFF):
        return None
    parts = ["BEGIN"]
    if raw.isolation_level is not None:
        parts.append("ISOLATION LEVEL " + IsolationLevel(raw.isolation_level).name.replace("_", " "))
    if raw.read_only is not None:
        parts.append("READ ONLY" if raw.read_only else "READ WRITE")
    if raw.deferrable is not None:
        parts.append("DEFERRABLE" if raw.deferrable else "NOT DEFERRABLE")
    return " ".join(parts)


@contextmanager
def sending_own_begin(connection: Any) -> Iterator[None]:
    """Inside the block psycopg sends no BEGIN of its own on ``connection``: the caller's next
    statement string carries ``begin_sql(connection)``. Only after ``begin_sql`` answered."""
    raw = connection.connection
    raw._autocommit = True  # what psycopg's lazy BEGIN looks at; the public setter would refuse later
    try:
        yield
    finally:
        raw._autocommit = False
