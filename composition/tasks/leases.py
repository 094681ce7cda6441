"""The task records this process is running, and ``TaskLeaseRenewer``, which keeps them RUNNING.

A RUNNING record's lease (``records.lease_s()``) is shorter than most runs, so one thread renews
every running record of the process every third of it, in one statement. A process that dies stops
renewing, and its records read READY within the lease, as the broker hands their messages out again.
"""

from __future__ import annotations

import threading
from collections import Counter

import structlog
from django.db import close_old_connections, connection

from composition.lifecycle.periodic import PeriodicComponent
from composition.tasks.records import TABLE, lease_s

__all__ = ["RunningRecords", "TaskLeaseRenewer", "running_records"]

log = structlog.get_logger("composition.tasks")


class RunningRecords:
    """The ids of the task records whose runs this process has under way, each counted as often as
    it runs here (two deliveries of one message may run side by side)."""

    def __init__(self) -> None:
        self._ids: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, record_id: str) -> None:
        with self._lock:
            self._ids[record_id] += 1

    def discard(self, record_id: str) -> None:
        with self._lock:
            self._ids[record_id] -= 1
            if self._ids[record_id] <= 0:
                del self._ids[record_id]

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self._ids)


running_records = RunningRecords()


class TaskLeaseRenewer(PeriodicComponent):
    """Renews the leases of this process's running task records every third of the lease; started
    before the worker threads and stopped after their drain. Idle, it touches no database."""

    name = "task-leases"
    depends_on = ("database",)
    stop_on_drain = False  # a draining run keeps its record RUNNING until it ends
    failure_event = "could not renew the running tasks' leases; their results read READY once they lapse"
    logger = log

    @property
    def interval_s(self) -> float:
        return lease_s() / 3

    def tick(self) -> None:
        ids = running_records.snapshot()
        if not ids:
            return
        close_old_connections()  # a connection the server closed while idle is replaced
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {TABLE} SET running_until = now() + make_interval(secs => %s) "
                           "WHERE id = ANY(%s::uuid[]) AND status = 'RUNNING'", [lease_s(), ids])
