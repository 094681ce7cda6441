"""Job time limits: Dramatiq's ``TimeLimit`` with a watchdog that can be disarmed and shielded.

Unlike Dramatiq's, the watchdog fires under its lock, so ``disarm()`` either wins or withdraws an
interrupt not yet delivered; ``@job`` disarms the moment the job body returns. ``shielded()``
defers the interrupt until a block that must not be cut ends; ``interrupt_job()`` sends a drain's
``Shutdown`` through the same watchdog. Past a thread's limit and until its message is finished,
a database call seen waiting for the server for ``CUT_AFTER_S`` is cut
(``composition.db.blocked_calls``): a call the network never answers blocks in C, where no
interrupt reaches. ``boot_worker_process(broker)`` starts the watchdog, as Dramatiq's CLI does.
"""

from __future__ import annotations

import ctypes
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import structlog
from dramatiq.broker import Broker
from dramatiq.middleware import Shutdown, ShutdownNotifications, TimeLimit, TimeLimitExceeded
from dramatiq.middleware.threading import raise_thread_exception

from composition.db.blocked_calls import cut_busy_connections_of, has_busy_connection

__all__ = [
    "CUT_AFTER_S",
    "INTERRUPTS",
    "JobShutdownNotifications",
    "JobTimeLimit",
    "TimeLimitExceeded",
    "boot_worker_process",
    "disarm_time_limit",
    "interrupt_job",
    "interrupt_running_job",
    "shielded",
    "time_limits_enforced",
]

# What the watchdog raises in a worker thread: a time limit's, a drain's.
INTERRUPTS = (TimeLimitExceeded, Shutdown)

# How often the watchdog looks at the deadlines (Dramatiq's default is 1 s): a time limit is
# enforced within this much of its value.
WATCHDOG_INTERVAL_S = 0.1

# A thread past its time limit whose message is not finished, seen waiting for the database this
# long, waits on a network that does not answer: a healthy database answers a job's last
# statements (its commit) well within it.
CUT_AFTER_S = 1.0

log = structlog.get_logger("composition.jobs")

# Thread ident -> nesting depth of shielded() blocks; read by every watchdog of this process.
_shield_lock = threading.Lock()
_shield_depth: dict[int, int] = {}
_watchdogs: weakref.WeakSet[_Watchdog] = weakref.WeakSet()


def _clear_pending_interrupt(thread_id: int) -> None:
    # PyThreadState_SetAsyncExc with NULL withdraws an asynchronous exception not yet delivered.
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), None)


class _Watchdog(threading.Thread):
    """Interrupts worker threads whose deadline passed; see the module doc for how it differs
    from Dramatiq's."""

    def __init__(self, interval_s: float) -> None:
        super().__init__(name="composition-time-limit", daemon=True)
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._deadlines: dict[int, float] = {}
        self._fired: set[int] = set()
        # Thread ident -> its time limit (monotonic), until its message is finished: a disarm
        # does not end it, as the commit and the bookkeeping come after.
        self._limits: dict[int, float] = {}
        # Thread ident -> (its time limit, when it was first seen overdue with a call waiting for
        # the database, at every look since): the watchdog's own.
        self._busy_since: dict[int, tuple[float, float]] = {}
        # Thread ident -> what to raise instead of TimeLimitExceeded (a drain's Shutdown).
        self._interrupts: dict[int, type[BaseException]] = {}
        self._boot_lock = threading.Lock()
        _watchdogs.add(self)

    def start(self) -> None:
        with self._boot_lock:  # idempotent: a second process_boot must not crash the worker
            if not self.is_alive() and self.ident is None:
                super().start()

    def add_timeout(self, thread_id: int, ttl_ms: float) -> None:
        with self._lock:
            self._fired.discard(thread_id)
            self._interrupts.pop(thread_id, None)
            self._deadlines[thread_id] = self._limits[thread_id] = time.monotonic() + ttl_ms / 1000

    def remove_timeout(self, thread_id: int) -> None:
        """The message is finished (Dramatiq's ``after_process_message``)."""
        self.disarm(thread_id)
        with self._lock:
            self._limits.pop(thread_id, None)

    def disarm(self, thread_id: int) -> None:
        with self._lock:
            self._deadlines.pop(thread_id, None)
            self._interrupts.pop(thread_id, None)
            if thread_id in self._fired:
                self._fired.discard(thread_id)
                _clear_pending_interrupt(thread_id)

    def fired(self, thread_id: int) -> bool:
        with self._lock:
            return thread_id in self._fired

    def interrupt_now(self, thread_id: int, exception: type[BaseException]) -> bool:
        """Make ``thread_id``'s deadline due, raising ``exception``; False if it has none here."""
        with self._lock:
            if thread_id not in self._deadlines or not self.is_alive():
                return False
            self._deadlines[thread_id] = float("-inf")
            self._limits[thread_id] = min(self._limits.get(thread_id, float("inf")), time.monotonic())
            self._interrupts[thread_id] = exception
            return True

    def run(self) -> None:
        while True:
            time.sleep(self.interval_s)
            now = time.monotonic()
            # Both locks while firing: a thread entering shielded() meanwhile is seen, or waits.
            with _shield_lock, self._lock:
                for thread_id, deadline in list(self._deadlines.items()):
                    if now >= deadline and thread_id not in _shield_depth:
                        del self._deadlines[thread_id]
                        self._fired.add(thread_id)
                        raise_thread_exception(thread_id, self._interrupts.pop(thread_id, TimeLimitExceeded))
                overdue = [(thread_id, limit) for thread_id, limit in self._limits.items() if now >= limit]
            self._cut_blocked_calls(overdue, now)

    def _cut_blocked_calls(self, overdue: list[tuple[int, float]], now: float) -> None:
        """Cut the calls of overdue threads seen waiting for the database at every look for
        ``CUT_AFTER_S``: one look could land on any quick call (a rollback, a dead letter's
        write). So is a commit after the body returned (no interrupt is meant to reach it) or a
        call inside ``shielded()``; a cut call fails as a lost connection would."""
        busy_since = {}
        for thread_id, limit in overdue:
            if not has_busy_connection(thread_id):
                continue
            seen_limit, since = self._busy_since.get(thread_id, (limit, now))
            since = since if seen_limit == limit else now  # a new message: a new watch
            if now - since < CUT_AFTER_S:
                busy_since[thread_id] = (limit, since)
            elif cut := cut_busy_connections_of(thread_id):
                log.warning("a job's thread was blocked in a database call past its time limit: "
                            "its busy connections were cut", thread=thread_id, connections=cut)
        self._busy_since = busy_since


class JobTimeLimit(TimeLimit):
    """Dramatiq's ``TimeLimit`` with the watchdog above (``time_limit`` in milliseconds, as in
    Dramatiq; ``float("inf")`` means none)."""

    def __init__(self, *, time_limit: float = 600_000, interval_s: float = WATCHDOG_INTERVAL_S) -> None:
        super().__init__(time_limit=time_limit)
        self.manager = _Watchdog(interval_s)  # type: ignore[assignment]

    def disarm(self) -> None:
        """Drop the calling thread's deadline, and withdraw its interrupt if it fired but has not
        been delivered yet."""
        self.manager.remove_timeout(threading.get_ident())


def disarm_time_limit() -> None:
    """End the calling worker thread's time limit now (the job body has returned or raised).

    A no-op outside a job. If the interrupt (a time limit's, a drain's) was delivered while this
    ran, it is swallowed: the body had already finished. One can also land as this is called,
    before its first line: callers catch ``INTERRUPTS`` around the call too.
    """
    thread_id = threading.get_ident()
    try:
        for watchdog in list(_watchdogs):
            watchdog.disarm(thread_id)
    except INTERRUPTS:
        pass


def interrupt_running_job(thread_id: int, exception: type[BaseException]) -> bool:
    """``interrupt_job``, or, when no watchdog runs in this process (a worker started without
    ``process_boot``), Dramatiq's direct raise. False when the job body had returned."""
    if interrupt_job(thread_id, exception):
        return True
    if time_limits_enforced():
        return False
    raise_thread_exception(thread_id, exception)
    return True


class JobShutdownNotifications(ShutdownNotifications):
    """Dramatiq's ``ShutdownNotifications`` (an actor declared ``notify_shutdown=True`` is
    interrupted as soon as the drain begins), through the watchdog like the drain's own
    interrupt: never after the job body returned, never inside ``shielded()``."""

    def __init__(self, notify_shutdown: bool = False) -> None:
        super().__init__(notify_shutdown)
        self.manager = _NotifyThroughTheWatchdog()  # type: ignore[assignment]  # same three methods


class _NotifyThroughTheWatchdog:
    """The threads running a notify-shutdown actor, interrupted through the watchdog."""

    def __init__(self) -> None:
        self.notifications: set[int] = set()

    def add_notification(self) -> None:
        self.notifications.add(threading.get_ident())

    def remove_notification(self) -> None:
        self.notifications.discard(threading.get_ident())

    def shutdown(self) -> None:
        for thread_id in list(self.notifications):
            interrupt_running_job(thread_id, Shutdown)


def interrupt_job(thread_id: int, exception: type[BaseException]) -> bool:
    """Raise ``exception`` in worker thread ``thread_id`` at the watchdog's next look, as an
    expired time limit would: only if its job body is still running, never inside
    ``shielded()`` (delivered when the block ends), withdrawn if the body returns first.

    False when no watchdog of this process holds a deadline for that thread: its body has
    returned (what is left, retry or dead-letter bookkeeping, must not be cut), or it runs
    under a broker without ``JobTimeLimit``.
    """
    return any(watchdog.interrupt_now(thread_id, exception) for watchdog in list(_watchdogs))


def time_limits_enforced() -> bool:
    """Whether a time-limit watchdog runs in this process (``boot_worker_process`` started it)."""
    return any(watchdog.is_alive() for watchdog in list(_watchdogs))


@contextmanager
def shielded() -> Iterator[None]:
    """No time-limit interrupt lands in the calling thread inside this block; one that became
    due meanwhile is delivered at the watchdog's next look after the block."""
    thread_id = threading.get_ident()
    # An interrupt already on its way can land while this registers; the finally then puts the
    # depth back as it was, or the thread would stay shielded for good.
    depth_before: int | None = None
    try:
        with _shield_lock:
            depth_before = _shield_depth.get(thread_id, 0)
            _shield_depth[thread_id] = depth_before + 1
        yield
    finally:
        if depth_before is not None:
            with _shield_lock:
                if depth_before:
                    _shield_depth[thread_id] = depth_before
                else:
                    _shield_depth.pop(thread_id, None)


_booted: weakref.WeakSet[Broker] = weakref.WeakSet()
_boot_lock = threading.Lock()


def boot_worker_process(broker: Broker) -> None:
    """Emit ``process_boot`` for ``broker`` once in this process, as Dramatiq's CLI does before
    its workers start: it starts the time-limit watchdog (and any other middleware's
    per-process set-up)."""
    with _boot_lock:
        if broker in _booted:
            return
        broker.emit_after("process_boot")
        # Dramatiq's emit_after logs a hook's failure and goes on: a watchdog whose thread the
        # host refused would leave every job without its time limit, unseen.
        if any(isinstance(each, JobTimeLimit) and not (isinstance(each.manager, _Watchdog) and each.manager.is_alive())
               for each in broker.middleware):
            raise RuntimeError("the job time-limit watchdog did not start (see the log above): no job's "
                               "timeout_s would be enforced")
        _booted.add(broker)
