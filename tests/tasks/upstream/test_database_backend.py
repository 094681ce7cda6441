"""django-tasks-db 0.12.0's ``tests/tests.py``: its ``DatabaseBackend`` test cases, adapted to
``composition.tasks.OutboxBackend`` and real ``runworkers`` processes.

Copyright (c) Jake Howard and individual contributors; BSD 3-Clause, see LICENSE in this folder.
Adapted: where upstream runs ``db_worker`` in its own process, a worker process serving this
folder's queues runs the task and the test waits for the result; where it counts or edits
``DBTaskResult`` rows, it reads results through ``get_result``. README.md lists every test
changed or left out, with its reason; the comments marked "Upstream:" say what a line replaces.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections, transaction
from django.test import TransactionTestCase, override_settings
from django.utils import timezone
from django.utils.connection import ConnectionProxy

from composition.errors import IncompatibleMessageError
from composition.outbox.models import OutboxMessage
from composition.tasks import OutboxBackend
from composition.tasks.errors import InvalidTaskReturnValue
from composition.testing import left_to_the_relay
from tests.tasks.upstream import ALIAS, BACKEND_SETTINGS, QUEUE, QUEUE_1
from tests.tasks.upstream import tasks as test_tasks
from tests.tasks.upstream.compat import (
    LOGGER_NAME,
    InvalidTaskError,
    Task,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
)
from tests.tasks.upstream.workers import FlushedBesideAWorker, status_of, wait_for, wait_started

if TYPE_CHECKING:
    from composition.testing import WorkerProcess
    from tests.tasks.upstream.workers import UpstreamWorkers

# The matrix cell runs it too (Makefile): real workers on Django 6's own django.tasks.
pytestmark = [pytest.mark.slow, pytest.mark.version_smoke, pytest.mark.empty_queues(QUEUE, QUEUE_1)]

# Upstream's tests use the "default" alias, a DatabaseBackend; these use this folder's.
# Upstream: 1 (the row). In autocommit, as these tests enqueue: BEGIN, the outbox row, the result
# record, COMMIT, then the row's mark as sent once the broker has the message (transactional
# enqueue); inside the caller's transaction, the two rows, and the mark after its COMMIT.
ENQUEUE_QUERIES = 5

default_task_backend: Any = ConnectionProxy(task_backends, ALIAS)


def statuses(*results: Any) -> list[str]:
    """Upstream counts ``DBTaskResult`` rows by status; these read the results."""
    return [status_of(result) for result in results]


@contextlib.contextmanager
def sent_with(**changes: Any) -> Iterator[None]:
    """The outbox row of the ``enqueue()`` in the block, sent with ``changes`` to its payload: as
    upstream creates a ``DBTaskResult`` with a bad task path, which ``enqueue()`` refuses. Left to
    the workers' relay, which reads the row after COMMIT."""
    with left_to_the_relay(), transaction.atomic():
        yield
        for row in OutboxMessage.objects.all():
            row.payload = {**row.payload, **changes}
            row.save(update_fields=["payload"])


class DatabaseBackendTestCase(TransactionTestCase):
    @pytest.fixture(autouse=True)
    def _workers(self, upstream_workers: UpstreamWorkers) -> None:
        self.workers = upstream_workers

    @contextlib.contextmanager
    def _capture_task_enqueued_signal(
        self,
    ) -> Iterator[list[tuple[type[OutboxBackend], Any]]]:
        received: list[tuple[type[OutboxBackend], Any]] = []

        def capture_signal(
            sender: type[OutboxBackend], task_result: Any, **kwargs: Any
        ) -> None:
            received.append((sender, task_result))

        task_enqueued.connect(
            capture_signal, dispatch_uid="db_enqueue_signal", weak=False
        )
        try:
            yield received
        finally:
            task_enqueued.disconnect(capture_signal, dispatch_uid="db_enqueue_signal")

    def get_task_count_in_new_connection(self) -> int:
        """
        See what other connections see
        """
        new_connection = connections.create_connection("default")
        try:
            with new_connection.cursor() as c:
                c.execute(str(OutboxMessage.objects.values("id").query))
                return len(c.fetchall())
        finally:
            new_connection.close()

    def test_using_correct_backend(self) -> None:
        self.assertEqual(default_task_backend, task_backends[ALIAS])
        self.assertIsInstance(task_backends[ALIAS], OutboxBackend)
        self.assertEqual(default_task_backend.alias, ALIAS)
        self.assertEqual(default_task_backend.options, BACKEND_SETTINGS["OPTIONS"])

    def test_enqueue_task(self) -> None:
        for task in [test_tasks.noop_task, test_tasks.noop_task_async]:
            with self.subTest(task), self.assertNumQueries(ENQUEUE_QUERIES):
                with self._capture_task_enqueued_signal() as received:
                    result = cast(Task, task).enqueue(1, two=3)

                self.assertEqual(uuid.UUID(result.id).version, 4)
                self.assertEqual(result.status, TaskResultStatus.READY)
                self.assertFalse(result.is_finished)
                self.assertIsNone(result.started_at)
                self.assertIsNone(result.last_attempted_at)
                self.assertIsNone(result.finished_at)
                with self.assertRaisesMessage(ValueError, "Task has not finished yet"):
                    result.return_value  # noqa:B018
                self.assertEqual(result.task, task)
                self.assertEqual(result.args, [1])
                self.assertEqual(result.kwargs, {"two": 3})
                self.assertEqual(result.attempts, 0)

                self.assertEqual(received, [(OutboxBackend, result)])

    async def test_enqueue_task_async(self) -> None:
        for task in [test_tasks.noop_task, test_tasks.noop_task_async]:
            with self.subTest(task):
                with self._capture_task_enqueued_signal() as received:
                    result = await cast(Task, task).aenqueue()

                self.assertEqual(uuid.UUID(result.id).version, 4)
                self.assertEqual(result.status, TaskResultStatus.READY)
                self.assertFalse(result.is_finished)
                self.assertIsNone(result.started_at)
                self.assertIsNone(result.last_attempted_at)
                self.assertIsNone(result.finished_at)
                with self.assertRaisesMessage(ValueError, "Task has not finished yet"):
                    result.return_value  # noqa:B018
                self.assertEqual(result.task, task)
                self.assertEqual(result.args, [])
                self.assertEqual(result.kwargs, {})
                self.assertEqual(result.attempts, 0)

                self.assertEqual(received, [(OutboxBackend, result)])

    def test_get_result(self) -> None:
        with self.assertNumQueries(ENQUEUE_QUERIES):  # Upstream: 1, as in test_enqueue_task.
            result = default_task_backend.enqueue(test_tasks.noop_task, [], {})

        with self.assertNumQueries(1):
            new_result = default_task_backend.get_result(result.id)

        self.assertEqual(result, new_result)

    async def test_get_result_async(self) -> None:
        result = await default_task_backend.aenqueue(test_tasks.noop_task, [], {})

        new_result = await default_task_backend.aget_result(result.id)

        self.assertEqual(result, new_result)

    def test_refresh_result(self) -> None:
        result = default_task_backend.enqueue(
            test_tasks.calculate_meaning_of_life, (), {}
        )

        # Upstream: DBTaskResult.objects.all().update(status=SUCCESSFUL, ..., return_value=42).
        worker = self.workers.spawn()
        wait_for([result], worker, statuses=[TaskResultStatus.SUCCESSFUL])

        self.assertEqual(result.status, TaskResultStatus.READY)
        self.assertFalse(result.is_finished)
        self.assertIsNone(result.started_at)
        self.assertIsNone(result.last_attempted_at)
        self.assertIsNone(result.finished_at)
        self.assertEqual(result.attempts, 0)

        with self.assertNumQueries(1):
            result.refresh()

        self.assertIsNotNone(result.started_at)
        self.assertIsNotNone(result.last_attempted_at)
        self.assertIsNotNone(result.finished_at)
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertTrue(result.is_finished)
        self.assertEqual(result.return_value, 42)
        self.assertEqual(result.attempts, 1)

    async def test_refresh_result_async(self) -> None:
        result = await default_task_backend.aenqueue(
            test_tasks.calculate_meaning_of_life, (), {}
        )

        # Upstream: await DBTaskResult.objects.all().aupdate(status=SUCCESSFUL, ...).
        worker = self.workers.spawn()
        await sync_to_async(wait_for)([result], worker, statuses=[TaskResultStatus.SUCCESSFUL])

        self.assertEqual(result.status, TaskResultStatus.READY)
        self.assertFalse(result.is_finished)
        self.assertIsNone(result.started_at)
        self.assertIsNone(result.last_attempted_at)
        self.assertIsNone(result.finished_at)
        self.assertEqual(result.attempts, 0)

        await result.arefresh()

        self.assertIsNotNone(result.started_at)
        self.assertIsNotNone(result.last_attempted_at)
        self.assertIsNotNone(result.finished_at)
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertTrue(result.is_finished)
        self.assertEqual(result.return_value, 42)
        self.assertEqual(result.attempts, 1)

    def test_get_missing_result(self) -> None:
        with self.assertRaises(TaskResultDoesNotExist):
            default_task_backend.get_result(str(uuid.uuid4()))

    async def test_async_get_missing_result(self) -> None:
        with self.assertRaises(TaskResultDoesNotExist):
            await default_task_backend.aget_result(str(uuid.uuid4()))

    def test_invalid_uuid(self) -> None:
        with self.assertRaises(TaskResultDoesNotExist):
            default_task_backend.get_result("123")

    async def test_async_invalid_uuid(self) -> None:
        with self.assertRaises(TaskResultDoesNotExist):
            await default_task_backend.aget_result("123")

    def test_check(self) -> None:
        errors = list(default_task_backend.check())

        self.assertEqual(len(errors), 0, errors)

    def test_priority_range_check(self) -> None:
        # Upstream writes DBTaskResult rows past its priority constraint (-101, 101 refused, 3.1
        # stored as 3). Here the range goes through enqueue() (Task.using refuses what is outside
        # it: test_tasks.TaskTestCase.test_invalid_priority), and the priority is read back.
        for priority in [100, -100, 0, 3]:
            with self.subTest(priority):
                result = test_tasks.noop_task.using(priority=priority).enqueue()
                self.assertEqual(result.task.priority, priority)
                self.assertEqual(default_task_backend.get_result(result.id).task.priority, priority)

    def test_doesnt_wait_until_transaction_commit(self) -> None:
        with transaction.atomic():
            result = test_tasks.noop_task.enqueue()

            self.assertIsNotNone(result.enqueued_at)

            self.assertEqual(OutboxMessage.objects.count(), 1)

            # SQLite locks the table during this transaction
            if connection.vendor != "sqlite":
                self.assertEqual(self.get_task_count_in_new_connection(), 0)

        if connection.vendor != "sqlite":
            self.assertEqual(self.get_task_count_in_new_connection(), 1)

    def test_enqueue_logs(self) -> None:
        with self.assertLogs(LOGGER_NAME, level="DEBUG") as captured_logs:
            result = test_tasks.noop_task.enqueue()

        self.assertEqual(len(captured_logs.output), 1)
        self.assertIn("enqueued", captured_logs.output[0])
        self.assertIn(result.id, captured_logs.output[0])

    def test_run_after_tz(self) -> None:
        for use_tz in [True, False]:
            with self.subTest(use_tz=use_tz), override_settings(USE_TZ=use_tz):
                result = test_tasks.noop_task.enqueue()
                # Upstream: DBTaskResult.objects.get(id=result.id).task.run_after
                self.assertIsNone(
                    default_task_backend.get_result(result.id).task.run_after
                )

    def test_validate_on_enqueue(self) -> None:
        with override_settings(
            TASKS={
                ALIAS: {
                    **BACKEND_SETTINGS,
                    "QUEUES": ["unknown_queue"],
                }
            }
        ):
            task_with_custom_queue_name = test_tasks.noop_task.using(
                queue_name="unknown_queue"
            )

        with self.assertRaisesMessage(
            InvalidTaskError, "Queue 'unknown_queue' is not valid for backend"
        ):
            task_with_custom_queue_name.enqueue()

    async def test_validate_on_aenqueue(self) -> None:
        with override_settings(
            TASKS={
                ALIAS: {
                    **BACKEND_SETTINGS,
                    "QUEUES": ["unknown_queue"],
                }
            }
        ):
            task_with_custom_queue_name = test_tasks.noop_task.using(
                queue_name="unknown_queue"
            )

        with self.assertRaisesMessage(
            InvalidTaskError, "Queue 'unknown_queue' is not valid for backend"
        ):
            await task_with_custom_queue_name.aenqueue()


class DatabaseBackendWorkerTestCase(FlushedBesideAWorker):
    # Upstream: run_worker = call_command("db_worker", batch=True, ...) in this process. Here a
    # worker process serves QUEUE (upstream's "default") for the whole class, and a test that
    # needs QUEUE_1 (upstream's "queue-1") served starts one. Upstream's base class is
    # TransactionTestCase; ours retries a flush that deadlocks with that worker.
    @pytest.fixture(autouse=True)
    def _workers(self, upstream_worker: WorkerProcess, upstream_workers: UpstreamWorkers) -> None:
        self.worker = upstream_worker
        self.workers = upstream_workers

    def test_run_enqueued_task(self) -> None:
        for task in [
            test_tasks.noop_task,
            test_tasks.noop_task_async,  # Upstream: commented out.
        ]:
            with self.subTest(task):
                # Upstream: DBTaskResult.objects.ready().count() == 1, before the worker runs.
                # The worker gets the task after COMMIT only: read before it.
                with transaction.atomic():
                    result = cast(Task, task).enqueue()
                    self.assertEqual(statuses(result), [TaskResultStatus.READY])

                self.assertEqual(result.status, TaskResultStatus.READY)

                wait_for([result], self.worker)  # Upstream: self.run_worker(), in assertNumQueries.

                self.assertEqual(result.status, TaskResultStatus.READY)
                self.assertEqual(result.attempts, 0)
                result.refresh()
                self.assertIsNotNone(result.started_at)
                self.assertIsNotNone(result.last_attempted_at)
                self.assertIsNotNone(result.finished_at)
                self.assertGreaterEqual(result.started_at, result.enqueued_at)  # type:ignore[arg-type,misc]
                self.assertGreaterEqual(result.finished_at, result.started_at)  # type:ignore[arg-type,misc]
                self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
                self.assertEqual(result.attempts, 1)

    def test_batch_processes_all_tasks(self) -> None:
        with transaction.atomic():
            results = [test_tasks.noop_task.enqueue() for _ in range(3)]
            results.append(test_tasks.failing_task_value_error.enqueue())

            self.assertEqual(statuses(*results).count(TaskResultStatus.READY), 4)

        wait_for(results, self.worker)

        counts = Counter(statuses(*results))
        self.assertEqual(counts[TaskResultStatus.READY], 0)
        self.assertEqual(counts[TaskResultStatus.SUCCESSFUL], 3)
        self.assertEqual(counts[TaskResultStatus.FAILED], 1)

    def test_doesnt_process_different_queue(self) -> None:
        result = test_tasks.noop_task.using(queue_name=QUEUE_1).enqueue()

        self.assertEqual(statuses(result), [TaskResultStatus.READY])

        # Upstream: a batch run of the "default" queue's worker takes nothing. Here the class's
        # worker (QUEUE) runs a task of its own queue meanwhile.
        wait_for([test_tasks.noop_task.enqueue()], self.worker)

        self.assertEqual(statuses(result), [TaskResultStatus.READY])

        # Upstream: self.run_worker(queue_name=result.task.queue_name)
        wait_for([result], self.workers.spawn(result.task.queue_name))

        self.assertEqual(statuses(result), [TaskResultStatus.SUCCESSFUL])

    def test_process_all_queues(self) -> None:
        result = test_tasks.noop_task.using(queue_name=QUEUE_1).enqueue()

        self.assertEqual(statuses(result), [TaskResultStatus.READY])

        wait_for([test_tasks.noop_task.enqueue()], self.worker)

        self.assertEqual(statuses(result), [TaskResultStatus.READY])

        # Upstream: self.run_worker(queue_name="*"). Every queue of the backend.
        wait_for([result], self.workers.spawn(QUEUE, QUEUE_1))

        self.assertEqual(statuses(result), [TaskResultStatus.SUCCESSFUL])

    def test_failing_task(self) -> None:
        with transaction.atomic():
            result = test_tasks.failing_task_value_error.enqueue()
            self.assertEqual(statuses(result), [TaskResultStatus.READY])

        wait_for([result], self.worker)

        self.assertEqual(result.status, TaskResultStatus.READY)
        result.refresh()
        self.assertIsNotNone(result.started_at)
        self.assertIsNotNone(result.last_attempted_at)
        self.assertIsNotNone(result.finished_at)

        self.assertGreaterEqual(result.started_at, result.enqueued_at)  # type: ignore
        self.assertGreaterEqual(result.finished_at, result.started_at)  # type: ignore
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        with self.assertRaisesMessage(ValueError, "Task failed"):
            result.return_value  # noqa: B018

        self.assertEqual(result.errors[0].exception_class, ValueError)
        traceback = result.errors[0].traceback
        self.assertTrue(
            traceback
            and traceback.endswith("ValueError: This task failed due to ValueError\n"),
            traceback,
        )

    def test_complex_exception(self) -> None:
        with transaction.atomic():
            result = test_tasks.complex_exception.enqueue()
            self.assertEqual(statuses(result), [TaskResultStatus.READY])

        wait_for([result], self.worker)

        self.assertEqual(result.status, TaskResultStatus.READY)
        result.refresh()
        self.assertIsNotNone(result.started_at)
        self.assertIsNotNone(result.last_attempted_at)
        self.assertIsNotNone(result.finished_at)

        self.assertGreaterEqual(result.started_at, result.enqueued_at)  # type: ignore
        self.assertGreaterEqual(result.finished_at, result.started_at)  # type: ignore
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        with self.assertRaisesMessage(ValueError, "Task failed"):
            result.return_value  # noqa: B018

        self.assertEqual(result.errors[0].exception_class, ValueError)
        self.assertIn(
            'ValueError(ValueError("This task failed"))', result.errors[0].traceback
        )

    def test_complex_return_value(self) -> None:
        result = test_tasks.complex_return_value.enqueue()

        wait_for([result], self.worker)

        result.refresh()

        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertIsNotNone(result.started_at)
        self.assertIsNotNone(result.last_attempted_at)
        self.assertIsNotNone(result.finished_at)
        self.assertGreaterEqual(result.started_at, result.enqueued_at)  # type:ignore[arg-type,misc]
        self.assertGreaterEqual(result.finished_at, result.started_at)  # type:ignore[arg-type,misc]

        self.assertIsNone(result._return_value)  # type:ignore[attr-defined]
        # Upstream: TypeError, "is not JSON serializable" (json.dumps's). OutboxBackend fails the
        # run with its own error (docs/tasks.md, "Results").
        self.assertEqual(result.errors[0].exception_class, InvalidTaskReturnValue)
        self.assertTrue(issubclass(result.errors[0].exception_class, TypeError))
        self.assertIn("InvalidTaskReturnValue", result.errors[0].traceback)

    def test_run_after(self) -> None:
        # Upstream: run_after 10 hours ahead, a worker run that leaves it, then the row's
        # run_after moved to now. Here 2 seconds ahead, and the worker runs it once due.
        run_after = timezone.now() + timedelta(seconds=2)
        result = test_tasks.noop_task.using(run_after=run_after).enqueue()

        self.assertEqual(statuses(result), [TaskResultStatus.READY])

        wait_for([test_tasks.noop_task.enqueue()], self.worker)

        self.assertEqual(statuses(result), [TaskResultStatus.READY])

        wait_for([result], self.worker)

        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertGreaterEqual(result.started_at, run_after)  # type:ignore[arg-type]

    def test_invalid_task_path(self) -> None:
        # Upstream: DBTaskResult.objects.create(task_path="subprocess.check_output", ...).
        with sent_with(task="subprocess.check_output", args=[["exit", "1"]]):
            result = test_tasks.noop_task.enqueue()

        wait_for([result], self.worker)

        self.assertEqual(statuses(result), [TaskResultStatus.FAILED])

    def test_missing_task_path(self) -> None:
        with sent_with(task="missing.func"):
            result = test_tasks.noop_task.enqueue()

        wait_for([result], self.worker)

        self.assertEqual(statuses(result), [TaskResultStatus.FAILED])

    def test_worker_doesnt_exit(self) -> None:
        result = test_tasks.exit_task.enqueue()

        wait_for([result], self.worker)

        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        # The worker carries on (upstream's db_worker runs in the test's own process).
        assert self.worker.process is not None
        self.assertIsNone(self.worker.process.poll())

    def test_takes_context(self) -> None:
        result = test_tasks.get_task_id.enqueue()

        wait_for([result], self.worker)

        result.refresh()

        self.assertEqual(result.return_value, result.id)

    def test_context(self) -> None:
        result = test_tasks.test_context.enqueue(1)

        wait_for([result], self.worker)
        result.refresh()

        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

    def test_task_import_string(self) -> None:
        with sent_with(task=f"{test_tasks.__name__}.some_test"):
            result = test_tasks.noop_task.enqueue()

        wait_for([result], self.worker)
        result.refresh()

        self.assertEqual(result.status, TaskResultStatus.FAILED)
        # Upstream: "ImportError" in the traceback. A worker refuses a message its code cannot
        # run as IncompatibleMessageError (a deploy may bring the task: docs/jobs.md), with the
        # ImportError's message.
        self.assertEqual(result.errors[0].exception_class, IncompatibleMessageError)
        self.assertIn('does not define a "some_test" attribute', result.errors[0].traceback)


class DatabaseWorkerProcessTestCase(TransactionTestCase):
    WORKER_STARTUP_TIME = 1

    @pytest.fixture(autouse=True)
    def _workers(self, upstream_workers: UpstreamWorkers) -> None:
        self.workers = upstream_workers

    def start_worker(self) -> WorkerProcess:
        # Upstream: db_worker --verbosity 3 --no-startup-delay --worker-id ... [--batch].
        return self.workers.spawn(QUEUE)

    def test_run_subprocess(self) -> None:
        result = test_tasks.noop_task.enqueue()
        process = self.start_worker()
        # Upstream: --batch, and process.wait(). runworkers has no batch mode: wait for the
        # result, then SIGTERM.
        wait_for([result], process)
        self.assertEqual(process.terminate(), 0)

        self.assertEqual(result.status, TaskResultStatus.READY)

        result.refresh()

        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

    def test_interrupt_no_tasks(self) -> None:
        process = self.start_worker()

        # Upstream: time.sleep(self.WORKER_STARTUP_TIME). Here: until it has started (a SIGTERM
        # before then, 1 s into a slow start, found no handler and ended it with -15).
        wait_started(process)

        # Upstream: process.wait(timeout=0.5). Idle, runworkers exits in about 0.3 s here; 0.5 s
        # is within a loaded gate's noise.
        self.assertEqual(process.terminate(timeout_s=2), 0)

    def test_interrupt_signals(self) -> None:
        for sig in [
            signal.SIGINT,  # ctrl-c
            signal.SIGTERM,
        ]:
            with self.subTest(sig):
                result = test_tasks.sleep_for.enqueue(2)
                # Upstream: DBTaskResult.objects.get(id=result.id).worker_ids == []
                self.assertEqual(default_task_backend.get_result(result.id).worker_ids, [])

                self.assertGreater(result.args[0], self.WORKER_STARTUP_TIME)

                process = self.start_worker()

                # Upstream: time.sleep(self.WORKER_STARTUP_TIME), "make sure the task is running by
                # now". Here: until it runs.
                wait_for([result], process, statuses=[TaskResultStatus.RUNNING], timeout_s=10)

                result.refresh()
                self.assertEqual(result.status, TaskResultStatus.RUNNING)
                self.assertNotEqual(
                    default_task_backend.get_result(result.id).worker_ids, []
                )

                process.signal(sig)

                # Upstream: timeout=2, signalled 1 s into the task. Here as soon as it runs: the
                # drain waits for all of its 2 s.
                assert process.process is not None
                process.process.wait(timeout=5)

                self.assertEqual(process.process.returncode, 0)

                result.refresh()

                self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

    def test_system_exit_task(self) -> None:
        result = test_tasks.failing_task_system_exit.enqueue()

        process = self.start_worker()
        wait_for([result], process)  # Upstream: --batch, and process.wait(timeout=2).

        self.assertEqual(process.terminate(), 0)

        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertEqual(result.errors[0].exception_class, SystemExit)

    def test_keyboard_interrupt_task(self) -> None:
        result = test_tasks.failing_task_keyboard_interrupt.enqueue()

        process = self.start_worker()
        wait_for([result], process)

        self.assertEqual(process.terminate(), 0)

        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertEqual(result.errors[0].exception_class, KeyboardInterrupt)

    def test_multiple_workers(self) -> None:
        results = [test_tasks.sleep_for.enqueue(0.1) for _ in range(10)]

        processes = [self.start_worker() for _ in range(3)]

        # Upstream: each --batch worker exits once the queue is empty; here they are stopped then.
        wait_for(results, processes[0])

        for process in processes:
            # The other two may have run all ten while this one was still starting (CI saw -15).
            wait_started(process)
            self.assertEqual(process.terminate(), 0)

        for result in results:
            result.refresh()
            self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

        # Upstream: every result id twice in the workers' output (RUNNING, SUCCESSFUL), and
        # "gracefully" in each. Here: each task ran once, by one of the three.
        workers = {f"{socket.gethostname()}:{process.pid}" for process in processes}
        for result in results:
            self.assertEqual(len(result.worker_ids), 1)
            self.assertIn(result.worker_ids[0], workers)
