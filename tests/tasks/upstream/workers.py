"""Real ``runworkers`` processes on this folder's queues, and waiting for the results they write:
what replaces upstream's in-process ``db_worker`` runs."""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Iterable
from typing import Any

from django.core.management.base import CommandError
from django.test import TransactionTestCase

from composition.testing import WorkerProcess, empty_queues, subprocess_env, wait_until
from tests.tasks.upstream import ALIAS, QUEUE, QUEUE_1
from tests.tasks.upstream.compat import TaskResultStatus, task_backends

__all__ = ["FINISHED", "FlushedBesideAWorker", "UpstreamWorkers", "status_of", "wait_for", "wait_started"]

FINISHED = (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
THREADS = 2
# How long a task of these tests may take from its enqueue to its end, worker start-up included.
RESULT_TIMEOUT_S = 30.0


class FlushedBesideAWorker(TransactionTestCase):
    """A TransactionTestCase whose class-scoped worker process (``upstream_worker``) keeps
    writing while each test's flush truncates every table: PostgreSQL may end the flush as a
    deadlock's victim, and the flush is tried again (the worker's transaction then goes through)."""

    def _fixture_teardown(self) -> None:
        for attempt in range(3):
            try:
                super()._fixture_teardown()
                return
            except CommandError as exc:
                if attempt == 2 or "deadlock detected" not in str(exc.__cause__ or exc.__context__):
                    raise
                time.sleep(0.2)


class UpstreamWorkers:
    """``spawn(*queues)`` starts a ``runworkers`` process serving ``queues`` (default: ``QUEUE``);
    ``close()`` stops every one started (SIGTERM and its drain, SIGKILL if it does not stop)."""

    def __init__(self) -> None:
        self.started: list[WorkerProcess] = []

    def spawn(self, *queues: str) -> WorkerProcess:
        args = ["--threads", str(THREADS), "--queues", ",".join(queues or (QUEUE,))]
        process = WorkerProcess(args, env=subprocess_env()).start()
        self.started.append(process)
        return process

    def close(self) -> None:
        try:
            for process in self.started:
                if process.process is not None and process.process.poll() is None:
                    process.terminate()
        finally:
            for process in self.started:
                process.close()
            empty_queues(QUEUE, QUEUE_1)


def status_of(result: Any) -> str:
    """The status ``get_result`` reads now for ``result`` (which is left as it is)."""
    return str(task_backends[ALIAS].get_result(result.id).status)


def wait_for(results: Iterable[Any], worker: WorkerProcess, statuses: Collection[str] = FINISHED,
             timeout_s: float = RESULT_TIMEOUT_S) -> None:
    """Wait until every one of ``results`` reads one of ``statuses``; else fail with the statuses
    read and the end of ``worker``'s log."""
    results = list(results)
    try:
        wait_until(lambda: all(status_of(result) in statuses for result in results), timeout_s=timeout_s)
    except AssertionError:
        raise AssertionError(f"{[status_of(result) for result in results]} after {timeout_s} s, not all in "
                             f"{list(statuses)}; worker log:\n{worker.output()[-3000:]}") from None


def wait_started(worker: WorkerProcess, timeout_s: float = RESULT_TIMEOUT_S) -> None:
    """Wait until ``worker`` has started every component (its heartbeat is the last): a signal
    before then finds no handler installed yet, and ends it as the signal's default does."""
    def started() -> bool:
        for line in worker.output().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == "component started" and record.get("component") == "workers":
                return True
        return False

    wait_until(started, timeout_s=timeout_s, message=f"the worker did not start; log:\n{worker.output()[-3000:]}")
