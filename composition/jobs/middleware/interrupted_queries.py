"""A query an interrupt lands in is cancelled, so that its connection stays usable.

A time limit or a drain's ``Shutdown`` raised during a query (pure-Python psycopg) leaves the
connection busy and the query running on with its locks. ``InterruptedQueries`` wraps the worker
thread's PostgreSQL connections with ``cancel_on_interrupt`` before each job, which cancels the
query so the transaction rolls back as usual; a connection not freed within ``CANCEL_TIMEOUT_S`` is
closed right after the job, before the retry and dead-letter bookkeeping needs the database.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable
from typing import Any

import structlog
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Middleware
from psycopg import pq

from composition.errors import described
from composition.jobs.connection_hygiene import thread_connections

__all__ = ["CANCEL_TIMEOUT_S", "InterruptedQueries", "cancel_on_interrupt", "close_interrupted_connections"]

log = structlog.get_logger("composition.jobs")

_COPY_STATUSES = (pq.ExecStatus.COPY_IN, pq.ExecStatus.COPY_OUT, pq.ExecStatus.COPY_BOTH)

# How long cancelling an interrupted query may take (the cancel request, then the server's
# answer) before its connection is closed instead.
CANCEL_TIMEOUT_S = 2.0


def cancel_on_interrupt(execute: Callable[..., Any], sql: str, params: Any, many: bool,
                        context: dict[str, Any]) -> Any:
    """Django execute wrapper: an interrupt (any ``BaseException`` that is not an ``Exception``)
    landing with the query in flight cancels the query before it goes on up."""
    try:
        return execute(sql, params, many, context)
    except Exception:
        raise
    except BaseException:
        _cancel_in_flight(context["connection"])
        raise


def _busy(wrapper: BaseDatabaseWrapper) -> Any:
    """The libpq connection of ``wrapper`` if it has a query in flight, else None."""
    pgconn = getattr(wrapper.connection, "pgconn", None)
    if wrapper.vendor != "postgresql" or pgconn is None or pgconn.transaction_status != pq.TransactionStatus.ACTIVE:
        return None
    return pgconn


def _cancel_in_flight(wrapper: BaseDatabaseWrapper) -> bool:
    """Cancel the query in flight on ``wrapper`` and read the server's answers, all within
    ``CANCEL_TIMEOUT_S``; True when the connection is ready again (or was never busy)."""
    pgconn = _busy(wrapper)
    if pgconn is None:
        return True
    deadline = time.monotonic() + CANCEL_TIMEOUT_S
    try:
        wrapper.connection.cancel_safe(timeout=CANCEL_TIMEOUT_S)
        # One string may hold several statements (a row lock's SAVEPOINT; SELECT; RELEASE): wait
        # for each result before reading it, so that no read blocks past the deadline.
        while True:
            if not _wait_for_result(pgconn, deadline):
                return False
            result = pgconn.get_result()
            if result is None:
                break
            if result.status in _COPY_STATUSES:
                return False  # a COPY wants the client: leave it to the close
    except Exception as exc:
        log.warning("could not cancel an interrupted query", alias=wrapper.alias, error=described(exc))
        return False
    log.info("interrupted query cancelled", alias=wrapper.alias)
    return True


def _wait_for_result(pgconn: Any, deadline: float) -> bool:
    """Wait until ``pgconn`` can return its next result without blocking; False at the deadline."""
    poller = select.poll()
    poller.register(pgconn.socket, select.POLLIN)
    while pgconn.is_busy():
        remaining_ms = (deadline - time.monotonic()) * 1000
        if remaining_ms <= 0:
            return False
        poller.poll(remaining_ms)
        pgconn.consume_input()
    return True


def close_interrupted_connections() -> None:
    """Close this thread's PostgreSQL connections still left with a query in flight."""
    for wrapper in connections.all(initialized_only=True):
        if _busy(wrapper) is None:
            continue
        log.warning("closing a database connection an interrupt left mid-query", alias=wrapper.alias)
        try:
            wrapper.close()
        except Exception as exc:
            log.warning("could not close the interrupted connection", alias=wrapper.alias, error=str(exc))
            wrapper.connection = None


class InterruptedQueries(Middleware):
    """Cancels a query an interrupt lands in, and closes what it could not (see module doc)."""

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        for wrapper in thread_connections():
            # First in the list is outermost: it also covers what the other wrappers send.
            if wrapper.vendor == "postgresql" and cancel_on_interrupt not in wrapper.execute_wrappers:
                wrapper.execute_wrappers.insert(0, cancel_on_interrupt)

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        if exception is not None:
            close_interrupted_connections()

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        close_interrupted_connections()
