"""After-commit bookkeeping on one thread per process, in batches (``submit``, ``flush``).

What a request does after its COMMIT for the library's own sake (sending the outbox rows it
published, deleting the records of the cache invalidations it applied) would add round trips to
every write request and make it wait for them. Handed to ``submit`` instead, it runs on one
thread of the process, which takes everything handed in while it was busy with the last batch
and gives each handler its items in one call: one broker round trip and one UPDATE for the
outbox rows of many requests, one DELETE for their invalidation records. Under load a batch
carries the work of many requests; in an idle process a batch of one starts at once.

Only work whose loss is repaired elsewhere may be handed in: a process that dies (SIGKILL)
loses what it had not done yet. Its users say what repairs theirs: ``composition.outbox`` (a row
not sent is relayed by the sweep once its lease runs out) and ``composition.cache.invalidation``
(a record not deleted is replayed, which is harmless). A process that exits normally does it
first (``atexit``, bounded by ``EXIT_FLUSH_S``); ``flush()`` waits for everything handed in so
far, for a worker's drain and for tests.

The thread starts with the first item and ends after ``IDLE_EXIT_S`` with nothing to do,
closing its database connection (the connection budget counts it: ``manage.py system``).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import structlog
from django.db import DEFAULT_DB_ALIAS, connections

from composition.metrics import AFTER_COMMIT_BACKLOG, AFTER_COMMIT_FAILURES_TOTAL, AFTER_COMMIT_ROUND_SECONDS

__all__ = ["EXIT_FLUSH_S", "IDLE_EXIT_S", "Batcher", "flush", "stop", "submit"]

log = structlog.get_logger("composition.background")

# The thread ends after this long with nothing handed in (the next item starts it again): long
# enough that sparse traffic does not pay a new thread and database connection per request.
IDLE_EXIT_S = 30.0
# How long a normal exit waits for work still to be done (SIGTERM's drain has its own deadline).
EXIT_FLUSH_S = 5.0

# A handler takes the items handed in for it, oldest first. It must not raise for a failure
# whose repair it can leave to the mechanism behind it; if it does, that is logged and its
# items are dropped.
Handler = Callable[[list[Any]], None]


class Batcher:
    """One thread running handlers on the items handed in with ``submit``, in batches: each
    round takes every item submitted since the last round began and calls each handler once
    with its items, in submission order. Thread-safe, and fork-safe (a child starts afresh).
    ``exports_metrics``: the ``composition_after_commit_*`` metrics describe this one (the
    process's after-commit thread; one per process, so they need no label of their own)."""

    def __init__(self, name: str, *, idle_exit_s: float = IDLE_EXIT_S, exports_metrics: bool = False) -> None:
        self.name = name
        self.idle_exit_s = idle_exit_s
        self.exports_metrics = exports_metrics
        self._cond = threading.Condition()
        self._reset()
        _batchers.add(self)

    def _start_afresh_in_child(self) -> None:
        # A fork may come while the parent's thread holds the lock for a moment: the child's
        # copy would stay held by a thread the child does not have. A new one, and no items.
        self._cond = threading.Condition()
        self._reset()

    def _reset(self) -> None:
        self._items: list[tuple[Handler, Any]] = []
        self._submitted = 0  # items handed in, ever
        self._done = 0  # items handled (or dropped by a failing handler), ever
        self._thread: threading.Thread | None = None
        self._stop_requested = False
        self.rounds = 0  # for tests and operators
        if self.exports_metrics:  # a forked child holds none of its parent's items
            AFTER_COMMIT_BACKLOG.set(0)

    def submit(self, handler: Handler, item: Any) -> None:
        """Have ``handler`` called with ``item`` (among others) on the batcher's thread. Handlers
        are grouped by equality, so give the same function (or bound method) every time."""
        with self._cond:
            self._items.append((handler, item))
            self._submitted += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"{self.name}", daemon=True)
                self._thread.start()
            else:
                self._cond.notify()
        if self.exports_metrics:
            AFTER_COMMIT_BACKLOG.inc()

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything submitted before this call has been handled; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            target = self._submitted
            while self._done < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._thread is None:
                    return False
                self._cond.wait(remaining)
        return True

    def stop(self, timeout_s: float) -> bool:
        """Do what was handed in, then end the thread now rather than when idle (closing its
        database connection); False if that took longer than ``timeout_s``. A later ``submit``
        starts a new thread."""
        deadline = time.monotonic() + timeout_s
        done = self.flush(timeout_s)
        with self._cond:
            thread = self._thread
            if thread is not None:
                self._stop_requested = True
                self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
            done = done and not thread.is_alive()
        return done

    def pending(self) -> int:
        """Items submitted and not handled yet."""
        with self._cond:
            return self._submitted - self._done

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if not self._items and not self._stop_requested:
                        self._cond.wait(self.idle_exit_s)
                    if not self._items:
                        self._thread = None
                        self._stop_requested = False
                        self._cond.notify_all()
                        return
                    items, self._items = self._items, []
                started = time.monotonic()
                try:
                    self._round(items)
                finally:
                    with self._cond:
                        self.rounds += 1
                        self._done += len(items)
                        self._cond.notify_all()
                    if self.exports_metrics:
                        AFTER_COMMIT_BACKLOG.dec(len(items))
                        AFTER_COMMIT_ROUND_SECONDS.observe(time.monotonic() - started)
        finally:
            # The thread's own database connections (Django's are per thread): an idle process
            # keeps none, and a test database can be dropped.
            connections.close_all()
            with self._cond:
                if self._thread is threading.current_thread():
                    self._thread = None
                self._cond.notify_all()

    def _round(self, items: list[tuple[Handler, Any]]) -> None:
        by_handler: dict[Handler, list[Any]] = {}
        for handler, item in items:
            by_handler.setdefault(handler, []).append(item)
        for handler, handed in by_handler.items():
            try:
                handler(handed)
            except Exception as exc:
                name = getattr(handler, "__qualname__", type(handler).__name__)
                if self.exports_metrics:
                    AFTER_COMMIT_FAILURES_TOTAL.labels(name).inc()
                log.error("background bookkeeping failed; it is left to its repair", batcher=self.name,
                          handler=name, count=len(handed), error=f"{type(exc).__name__}: {exc}")
        # What Django does after every request, when there is reason to: a connection that broke
        # (a restarted or failed-over database) is closed, so the next round connects afresh
        # instead of failing again, and one past CONN_MAX_AGE is closed. Not every round: that
        # would cost a health check (CONN_HEALTH_CHECKS) per round.
        now = time.monotonic()
        for connection in connections.all(initialized_only=True):
            if connection.errors_occurred or (connection.close_at is not None and now >= connection.close_at):
                connection.close_if_unusable_or_obsolete()


_batchers: weakref.WeakSet[Batcher] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for batcher in list(_batchers):
        batcher._start_afresh_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)

_after_commit = Batcher("composition-after-commit", exports_metrics=True)


def submit(handler: Handler, item: Any, *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Hand ``item`` to ``handler`` on this process's after-commit thread (see the module doc).

    When the calling thread's connection to database ``using`` is still inside a transaction
    (on-commit hooks run inside an enclosing ``atomic``, as a test's captured ones do), the
    thread could not see that transaction's rows: ``handler`` runs now, on the calling thread.
    """
    if connections[using].in_atomic_block:
        handler([item])
        return
    _after_commit.submit(handler, item)


def flush(timeout_s: float) -> bool:
    """Wait until this process's after-commit thread has done what was handed in so far; False
    if it had not within ``timeout_s``."""
    return _after_commit.flush(timeout_s)


def stop(timeout_s: float) -> bool:
    """Do what was handed in and end this process's after-commit thread now (closing its
    database connection), as before a test database is dropped; False on timeout."""
    return _after_commit.stop(timeout_s)


@atexit.register
def _flush_at_exit() -> None:
    if not flush(EXIT_FLUSH_S):
        log.warning("exiting with after-commit bookkeeping not done; it is repaired later "
                    "(the outbox sweep, the cache replay)", pending=_after_commit.pending())
