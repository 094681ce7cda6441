"""Database session timeouts, and closing every connection this process opened.

Every new PostgreSQL connection gets ``statement_timeout`` (``DB_STATEMENT_TIMEOUT_S``) and
``idle_in_transaction_session_timeout`` (``DB_IDLE_IN_TRANSACTION_TIMEOUT_S``), lifted while
``migrate`` runs and inside ``without_session_timeouts()``; none on a transaction-pooled alias,
where the role holds them (``composition.db.pooling``). Connections are remembered weakly, so
stopping a process closes its worker threads' connections too (``connections.close_all()`` closes
only the calling thread's).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from composition.conf import conf
from composition.db.pooling import is_transaction_pooled
from composition.errors import ConfigurationError

__all__ = ["apply_session_timeouts", "close_all_connections", "lift_timeouts_for_migrate",
           "restore_timeouts_after_migrate", "without_session_timeouts"]

# The lifts open in this thread, by alias (without_session_timeouts() blocks and migrations).
# Per thread because Django's connections are: a lift that reached another thread's new
# connection would outlast the block there, as nothing restores it when the block ends.
_lifts = threading.local()
_opened: weakref.WeakSet[BaseDatabaseWrapper] = weakref.WeakSet()


def _open_lifts() -> dict[str, int]:
    if not hasattr(_lifts, "by_alias"):
        _lifts.by_alias, _lifts.migrating = {}, set()
    by_alias: dict[str, int] = _lifts.by_alias
    return by_alias


def _migrating() -> set[str]:
    """The aliases this thread's ``migrate`` lifted (its signals come once per app)."""
    _open_lifts()
    migrating: set[str] = _lifts.migrating
    return migrating


def _lifted(using: str) -> bool:
    return _open_lifts().get(using, 0) > 0


def _set_timeouts(connection: BaseDatabaseWrapper, *, lifted: bool) -> None:
    statement_ms = 0 if lifted else int(float(conf.DB_STATEMENT_TIMEOUT_S) * 1000)
    idle_ms = 0 if lifted else int(float(conf.DB_IDLE_IN_TRANSACTION_TIMEOUT_S) * 1000)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('statement_timeout', %s, false),"
            " set_config('idle_in_transaction_session_timeout', %s, false)",
            [f"{statement_ms}ms", f"{idle_ms}ms"],
        )


def apply_session_timeouts(sender: Any, connection: BaseDatabaseWrapper, **_: Any) -> None:
    """``connection_created`` receiver: remember the connection and set its timeouts (none
    while this thread lifts them for its alias)."""
    _opened.add(connection)
    if connection.vendor == "postgresql" and not is_transaction_pooled(connection.alias):
        _set_timeouts(connection, lifted=_lifted(connection.alias))


def _reapply(using: str) -> None:
    connection = connections[using]
    if connection.vendor == "postgresql" and connection.connection is not None and not is_transaction_pooled(using):
        _set_timeouts(connection, lifted=_lifted(using))


@contextmanager
def without_session_timeouts(using: str = DEFAULT_DB_ALIAS) -> Iterator[None]:
    """No statement or idle-in-transaction timeout inside the block, on the calling thread's
    connection to ``using`` (one it opens again meanwhile too); other threads and databases
    keep theirs. Outside it the configured timeouts apply again to that connection. Raises
    ``ConfigurationError`` for a transaction-pooled ``using``: the lift would reach whichever
    client the pooler gives that connection next."""
    if is_transaction_pooled(using):
        raise ConfigurationError(f"without_session_timeouts({using!r}): the database is transaction-pooled; "
                                 "run the long work on a direct connection (another DATABASES alias)")
    lifts = _open_lifts()
    lifts[using] = lifts.get(using, 0) + 1
    try:
        _reapply(using)
        yield
    finally:
        lifts[using] -= 1
        _reapply(using)


def lift_timeouts_for_migrate(sender: Any, using: str = DEFAULT_DB_ALIAS, **_: Any) -> None:
    """``pre_migrate`` receiver (sent once per app, in the migrating thread; the first one lifts)."""
    migrating = _migrating()
    if using in migrating:
        return
    migrating.add(using)
    lifts = _open_lifts()
    lifts[using] = lifts.get(using, 0) + 1
    _reapply(using)


def restore_timeouts_after_migrate(sender: Any, using: str = DEFAULT_DB_ALIAS, **_: Any) -> None:
    """``post_migrate`` receiver (sent once per app; the first one restores)."""
    migrating = _migrating()
    if using not in migrating:
        return
    migrating.discard(using)
    _open_lifts()[using] -= 1
    _reapply(using)


def close_all_connections() -> int:
    """Close every database connection this process opened, in whatever thread; returns how
    many were open. For a process that is stopping: the owning threads must be done with them."""
    closed = 0
    for connection in list(_opened):
        if connection.connection is None:
            continue
        # Closing from another thread is what Django's thread-sharing switch is for.
        connection.inc_thread_sharing()
        try:
            connection.close()
            closed += 1
        except Exception:  # a broken connection is as good as closed
            pass
        finally:
            connection.dec_thread_sharing()
    connections.close_all()
    return closed
