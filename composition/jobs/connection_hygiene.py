"""Database connections between two jobs on one worker thread.

Worker threads never see Django's ``request_finished``, so ``MessageContext`` does its part
around each message: ``close_old_connections()``, plus ``check_connections``, Django's health
check of a reused connection (``CONN_HEALTH_CHECKS``) without its ``SELECT 1`` round trip.

``InterruptedQueries`` runs ``close_interrupted_connections`` right after the job, before the
retry and dead-letter bookkeeping that needs the database: a time limit or a drain's ``Shutdown`` raised while a query
  was in flight leaves its connection busy with that query. The pure-Python psycopg waits for a
  result in Python code, where the interrupt lands; psycopg cancels the query for a
  ``KeyboardInterrupt`` only. Kept, that connection fails the thread's next job with "another
  command is already in progress" (outside a transaction nothing else closes it), and its query
  runs on in the server until ``statement_timeout``. It is cancelled and closed instead.
"""

from __future__ import annotations

import select
from typing import Any

import structlog
from django.db import connections
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Middleware
from psycopg import pq

__all__ = ["InterruptedQueries", "check_connections", "close_interrupted_connections"]

log = structlog.get_logger("composition.jobs")

# How long the cancel request of an interrupted query may take before the connection is closed
# anyway (the server then ends the query when it next writes to the closed socket).
CANCEL_TIMEOUT_S = 2.0


def check_connections() -> None:
    """Django's health check of this thread's open connections (``CONN_HEALTH_CHECKS``), without
    its ``SELECT 1`` round trip: a connection whose socket has something to read while idle is
    closed (Django opens a new one on first use), any other is taken as healthy.

    Django checks a reused connection with a ``SELECT 1`` before the first query of each request;
    for a job that is a round trip per message (a fifth of an idempotent job's database work).
    An idle connection has nothing to read unless the server ended it (a restart, an idle
    timeout or ``pg_terminate_backend`` send an error and close), so looking at the socket finds
    what the ``SELECT 1`` would; a network path that died silently stalls both alike. Connections
    of other databases than PostgreSQL, or with nothing to poll, are left to Django's own check.
    """
    for wrapper in connections.all(initialized_only=True):
        raw = wrapper.connection
        # health_check_done: Django's own flag (4.1+) for "checked since the last close_old_connections()".
        if raw is None or wrapper.vendor != "postgresql" or not getattr(wrapper, "health_check_enabled", False) \
                or getattr(wrapper, "health_check_done", True):
            continue
        try:
            poller = select.poll()
            poller.register(raw.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
            readable = bool(poller.poll(0))
        except (OSError, ValueError, AttributeError):
            continue  # Django's SELECT 1 decides
        if readable or getattr(raw, "closed", False):
            wrapper.close()
        else:
            wrapper.health_check_done = True  # type: ignore[attr-defined]


def close_interrupted_connections() -> None:
    """Cancel and close this thread's PostgreSQL connections left with a query in flight."""
    for wrapper in connections.all(initialized_only=True):
        pgconn = getattr(wrapper.connection, "pgconn", None)
        if wrapper.vendor != "postgresql" or pgconn is None or \
                pgconn.transaction_status != pq.TransactionStatus.ACTIVE:
            continue
        log.warning("closing a database connection an interrupt left mid-query", alias=wrapper.alias)
        try:
            wrapper.connection.cancel_safe(timeout=CANCEL_TIMEOUT_S)
        except Exception as exc:  # closed below all the same
            log.warning("could not cancel the interrupted query", alias=wrapper.alias, error=str(exc))
        try:
            wrapper.close()
        except Exception as exc:
            log.warning("could not close the interrupted connection", alias=wrapper.alias, error=str(exc))
            wrapper.connection = None


class InterruptedQueries(Middleware):
    """``close_interrupted_connections`` after every message (see module doc)."""

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        if exception is not None:
            close_interrupted_connections()

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        close_interrupted_connections()
