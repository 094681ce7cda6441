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

_lock = threading.Lock()
_exemptions = 0  # open without_session_timeouts() blocks and migrations, process-wide
_migrating: set[str] = set()
_opened: weakref.WeakSet[BaseDatabaseWrapper] = weakref.WeakSet()


def _timeouts_lifted() -> bool:
    with _lock:
        return _exemptions > 0


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
    while they are lifted)."""
    _opened.add(connection)
    if connection.vendor == "postgresql" and not is_transaction_pooled(connection.alias):
        _set_timeouts(connection, lifted=_timeouts_lifted())


def _reapply(using: str) -> None:
    connection = connections[using]
    if connection.vendor == "postgresql" and connection.connection is not None and not is_transaction_pooled(using):
        _set_timeouts(connection, lifted=_timeouts_lifted())


@contextmanager
def without_session_timeouts(using: str = DEFAULT_DB_ALIAS) -> Iterator[None]:
    """No statement or idle-in-transaction timeout inside the block: on the calling thread's
    connection to ``using`` and on every connection opened meanwhile. Outside it the configured
    timeouts apply again to that connection. Raises ``ConfigurationError`` for a transaction-pooled
    ``using``: the lift would reach whichever client the pooler gives that connection next."""
    if is_transaction_pooled(using):
        raise ConfigurationError(f"without_session_timeouts({using!r}): the database is transaction-pooled; "
                                 "run the long work on a direct connection (another DATABASES alias)")
    global _exemptions
    with _lock:
        _exemptions += 1
    try:
        _reapply(using)
        yield
    finally:
        with _lock:
            _exemptions -= 1
        _reapply(using)


def lift_timeouts_for_migrate(sender: Any, using: str = DEFAULT_DB_ALIAS, **_: Any) -> None:
    """``pre_migrate`` receiver (sent once per app; the first one lifts)."""
    global _exemptions
    with _lock:
        if using in _migrating:
            return
        _migrating.add(using)
        _exemptions += 1
    _reapply(using)


def restore_timeouts_after_migrate(sender: Any, using: str = DEFAULT_DB_ALIAS, **_: Any) -> None:
    """``post_migrate`` receiver (sent once per app; the first one restores)."""
    global _exemptions
    with _lock:
        if using not in _migrating:
            return
        _migrating.discard(using)
        _exemptions -= 1
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
