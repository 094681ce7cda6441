"""The database connections each thread opened, so that a job's time limit can end a call the
network never answers.

psycopg waits for the server in C, with no read timeout: a query on a cut network (one whose
kernel still acknowledges, so neither keepalives nor ``tcp_user_timeout`` fire, and the server
never got the query to time it out) blocks until the connection ends, and a thread blocked in C
never sees the interrupt Python raises in it. Shutting the connection's socket down ends the
wait at once: psycopg raises ``OperationalError``, the connection is broken (Django opens a new
one next time), and the interrupt lands. The server ends its side by its own
``idle_in_transaction_session_timeout``.
"""

from __future__ import annotations

import os
import socket
import threading
import weakref
from typing import Any

__all__ = ["cut_busy_connections_of", "has_busy_connection", "remember_connection"]

# libpq's PQTRANS_ACTIVE: a command was sent and its result has not been read.
_COMMAND_IN_PROGRESS = 1

_lock = threading.Lock()
# Thread ident -> the Django connection wrappers that thread opened (one per alias, reopened in
# place): weak, so a finished thread's go with it.
_opened: dict[int, weakref.WeakSet[Any]] = {}


def remember_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created`` receiver (it runs in the thread that connects)."""
    with _lock:
        _opened.setdefault(threading.get_ident(), weakref.WeakSet()).add(connection)


def _opened_by(thread_id: int) -> list[Any]:
    with _lock:
        return list(_opened.get(thread_id, ()))


def has_busy_connection(thread_id: int) -> bool:
    """Whether a connection ``thread_id`` opened is waiting for the server's answer now."""
    return any(_busy_socket(wrapper.connection) is not None for wrapper in _opened_by(thread_id))


def cut_busy_connections_of(thread_id: int) -> int:
    """Shut down the socket of each connection ``thread_id`` opened that is waiting for the
    server's answer to a command (an idle one is left alone); the number cut."""
    cut = 0
    for wrapper in _opened_by(thread_id):
        fileno = _busy_socket(wrapper.connection)
        if fileno is None:
            continue
        try:
            # A duplicate of the descriptor: shutdown() acts on the socket both share, and
            # closing the duplicate leaves psycopg's own descriptor to psycopg.
            with socket.socket(fileno=os.dup(fileno)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            continue  # closed meanwhile
        cut += 1
    return cut


def _busy_socket(raw: Any) -> int | None:
    """The socket of a PostgreSQL connection with a command in progress (psycopg 3 or 2), else
    None (no connection, closed, idle, or another database)."""
    if raw is None or getattr(raw, "closed", True):
        return None
    try:
        # psycopg 3, else psycopg2
        status = raw.info.transaction_status if hasattr(raw, "info") else raw.get_transaction_status()
        if int(status) != _COMMAND_IN_PROGRESS:
            return None
        return int(raw.fileno())
    except Exception:  # sqlite and the like, or a connection gone bad while we looked
        return None
