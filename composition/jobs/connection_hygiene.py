"""Database connections between two jobs on one worker thread.

Worker threads never see Django's ``request_finished``, so ``MessageContext`` does its part
around each message: ``refresh_connections()`` before it (Django's ``close_old_connections()``
plus ``check_connections``, Django's health check of a reused connection
(``CONN_HEALTH_CHECKS``) without its ``SELECT 1`` round trip, in one pass), and
``close_old_connections()``'s work after it (``close_obsolete_connections()``). Both go through
``thread_connections()``, the thread's wrappers looked up once. A connection an interrupt left
mid-query is ``composition.jobs.middleware.interrupted_queries``'s.
"""

from __future__ import annotations

import select
import threading
from collections.abc import Sequence

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

__all__ = ["check_connections", "close_obsolete_connections", "refresh_connections", "thread_connections"]

_thread = threading.local()


def thread_connections() -> Sequence[BaseDatabaseWrapper]:
    """The calling thread's connection wrapper of every database alias, looked up once per thread.

    Django keeps one wrapper object per alias and thread for the thread's life (a closed
    connection reopens in the same wrapper), so a worker thread need not ask ``connections``
    again for each message; a wrapper that has no connection open is a no-op to the functions
    here, as it is to Django's ``close_old_connections()``."""
    wrappers: Sequence[BaseDatabaseWrapper] | None = getattr(_thread, "wrappers", None)
    if wrappers is None:
        wrappers = _thread.wrappers = connections.all()
    return wrappers


def close_obsolete_connections() -> None:
    """Django's ``close_old_connections()`` on ``thread_connections()``: closes what an error left
    unusable or ``CONN_MAX_AGE`` made obsolete."""
    for wrapper in thread_connections():
        wrapper.close_if_unusable_or_obsolete()


def refresh_connections() -> None:
    """``close_obsolete_connections()`` then ``check_connections()``, in one pass."""
    for wrapper in thread_connections():
        wrapper.close_if_unusable_or_obsolete()
        _check(wrapper)


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
        _check(wrapper)


def _check(wrapper: BaseDatabaseWrapper) -> None:
    raw = wrapper.connection
    # health_check_done: Django's own flag (4.1+) for "checked since the last close_old_connections()".
    if raw is None or wrapper.vendor != "postgresql" or not getattr(wrapper, "health_check_enabled", False) \
            or getattr(wrapper, "health_check_done", True):
        return
    try:
        poller = select.poll()
        poller.register(raw.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
        readable = bool(poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return  # Django's SELECT 1 decides
    if readable or getattr(raw, "closed", False):
        wrapper.close()
    else:
        wrapper.health_check_done = True  # type: ignore[attr-defined]
