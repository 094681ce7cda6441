"""``OutboxBackend``: ``django.tasks`` enqueue through the transactional outbox.

``task.enqueue(...)`` checks the arguments and writes one outbox row in the caller's transaction
(``composition.outbox.publish``): rolled back, the task never runs; committed, the row is sent to
the broker right after COMMIT and a ``runworkers`` process runs it (``actors``), with the jobs'
retries, time limit, dead letters and ledger. The result id is a random UUID, the id of the
task's ``TaskRecord``, written beside the outbox row; ``get_result`` reads it (``results``).
"""

from __future__ import annotations

import contextlib
import uuid
from datetime import datetime
from functools import partial
from typing import Any, cast

from django.db import connection, transaction
from django.utils import timezone
from dramatiq import Actor

from composition.broker.configured import broker_kind
from composition.broker.priorities import PRIORITY_HEADER, unhonoured_priority
from composition.conf import conf
from composition.errors import PayloadValidationError
from composition.tasks._compat import (
    DEFAULT_TASK_QUEUE_NAME,
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from composition.tasks.actors import declare_task_actor
from composition.tasks.errors import InvalidTaskArguments
from composition.tasks.options import BackendOptions
from composition.tasks.payload import arguments_schema, is_importable, task_payload
from composition.tasks.results import read_result

__all__ = ["OutboxBackend"]


class OutboxBackend(BaseTaskBackend):
    """A ``django.tasks`` backend whose tasks go through the outbox and run under ``runworkers``.

    ``QUEUES`` (default ``["default"]``) are Dramatiq queues of the same names; ``OPTIONS`` set the
    run policy, for every queue or per queue (``composition.tasks.options``). Building the backend
    only reads those settings (``@task`` builds it at import); a bad one raises
    ``InvalidBackendOptions``. Deferred tasks (``run_after``), coroutine tasks (``async def``, run
    in an event loop of their own by the worker) and priorities are supported; on RabbitMQ a
    priority other than 0 needs ``RABBITMQ_MAX_PRIORITY``, and ``validate_task`` refuses it without.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        # Parsed first: a malformed QUEUES is reported by name, not as the base class's TypeError.
        parsed = BackendOptions.parse(alias, params.get("QUEUES", [DEFAULT_TASK_QUEUE_NAME]),
                                      params.get("OPTIONS", {}))
        super().__init__(alias, params)
        self.parsed_options = parsed

    def actor(self, queue: str) -> Actor[..., None]:
        """The actor that runs this backend's tasks on ``queue``, declared on the configured broker
        on first use (looked up each time: tests may swap the broker)."""
        return declare_task_actor(self.alias, queue, self.parsed_options.queues[queue])

    def declare_actors(self) -> list[Actor[..., None]]:
        """Declare the actor of every queue: what a worker process needs before it consumes."""
        return [self.actor(queue) for queue in sorted(self.parsed_options.queues)]

    def validate_task(self, task: Task[Any, Any]) -> None:
        """Django's checks, a ``run_after`` the outbox can delay to, and a priority only where the
        broker honours it."""
        run_after: Any = task.run_after
        # Before Django's, which took a timedelta (Celery's countdown) for a datetime and raised
        # AttributeError; and the outbox's bound, which named a delay_s nobody gave.
        if run_after is not None:
            from composition.outbox.publish import MAX_DELAY_S  # only at .using(run_after=...): apps ready

            if not isinstance(run_after, datetime) or timezone.is_naive(run_after):
                raise InvalidTask(f"run_after must be an aware datetime (timezone.now() + timedelta(...)), "
                                  f"got {run_after!r}")
            if (run_after - timezone.now()).total_seconds() > MAX_DELAY_S:
                raise InvalidTask(f"run_after is at most {MAX_DELAY_S / 86_400 / 365:g} years ahead, got "
                                  f"{run_after.isoformat()}")
        super().validate_task(task)
        problem = unhonoured_priority(task.priority, broker=broker_kind(str(conf.BROKER_URL)),
                                      queue_type=conf.RABBITMQ_QUEUE_TYPE, max_priority=conf.RABBITMQ_MAX_PRIORITY)
        if problem is not None:
            raise InvalidTask(problem)

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        """Write the task's outbox row in the current transaction; returns its READY result.

        Raises ``InvalidTask`` (a task this backend cannot run, or one not importable at its
        module path), ``InvalidTaskArguments`` (arguments that are not JSON or do not fit the
        function's signature) and the outbox's ``PayloadTooLargeError``; nothing is written then.
        """
        # Imported here: publishing loads the outbox's model, and @task builds this backend
        # wherever a tasks module is imported, possibly while Django's apps are still loading.
        from composition.outbox.errors import PayloadNotSerializableError
        from composition.outbox.publish import publish_with_headers

        self.validate_task(task)
        if not is_importable(task):
            raise InvalidTask(f"{task.module_path} is not importable at that path; a worker finds a task by it, "
                              "so define it at module level with @task, under its function's own name")
        try:
            plain_args = cast("list[Any]", normalize_json(list(args)))
            plain_kwargs = cast("dict[str, Any]", normalize_json(dict(kwargs)))
        except (TypeError, ValueError) as exc:
            raise InvalidTaskArguments(f"arguments of {task.module_path} must be JSON values: {exc}") from None
        try:
            arguments_schema(task).validate(plain_args, plain_kwargs)
        except PayloadValidationError as exc:
            raise InvalidTaskArguments(str(exc)) from None
        from composition.jobs.models import TaskRecord

        result_id = str(uuid.uuid4())
        # In autocommit, one transaction of the two rows, so the message is sent after both are in.
        with contextlib.nullcontext() if connection.in_atomic_block else transaction.atomic():
            try:
                row = publish_with_headers(
                    self.actor(task.queue_name), task_payload(task, plain_args, plain_kwargs, result_id),
                    headers={PRIORITY_HEADER: task.priority} if task.priority else {}, delay_s=_delay_s(task.run_after))
            except PayloadNotSerializableError as exc:
                raise InvalidTaskArguments(f"arguments of {task.module_path}: {exc}") from None
            # After the outbox row, which may be refused: nothing is written then.
            TaskRecord.objects.create(
                id=result_id, backend=self.alias, queue_name=task.queue_name, task_path=task.module_path,
                priority=task.priority, args=plain_args, kwargs=plain_kwargs, enqueued_at=row.created_at,
                run_after=task.run_after, message_id=row.message_id)
        result: TaskResult[Any, Any] = TaskResult(
            task=task, id=result_id, status=TaskResultStatus.READY, enqueued_at=row.created_at, started_at=None,
            finished_at=None, last_attempted_at=None, args=plain_args, kwargs=plain_kwargs, backend=self.alias,
            errors=[], worker_ids=[],
        )
        # "Enqueued" once it is: after COMMIT (at once in autocommit), never for a rolled-back row.
        transaction.on_commit(partial(task_enqueued.send, type(self), task_result=result), robust=True)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        """The task's current state (see ``composition.tasks.results``); raises
        ``TaskResultDoesNotExist`` for an id that is not one of this backend's tasks."""
        return read_result(self.alias, result_id)


def _delay_s(run_after: datetime | None) -> float | None:
    if run_after is None:
        return None
    return max(0.0, (run_after - timezone.now()).total_seconds())
