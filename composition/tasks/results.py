"""``get_result``: a task's state, read from its ``TaskRecord`` and the dead letter of its latest
message, in one query.

The record says what its runs wrote (``composition.tasks.records``), with two corrections: a
RUNNING record whose lease ran out reads READY (its process died; the broker hands its message out
again); a READY or FAILED record whose latest message has a dead letter reads as that dead letter
says, FAILED (dead or discarded) or READY (replayed), which also covers a message parked before
any run could write to the record. A result is found while its record is kept
(``TASK_RESULT_RETENTION_S`` after it finished).
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime
from typing import Any

from django.db.models import BooleanField, ExpressionWrapper, OuterRef, Q, Subquery
from django.db.models.functions import Now

from composition.errors import described
from composition.tasks._compat import (
    DEFAULT_TASK_PRIORITY,
    InvalidTask,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)
from composition.tasks.payload import resolve_task
from composition.tasks.records import exception_class_path

__all__ = ["read_result"]


def read_result(alias: str, result_id: str) -> TaskResult[Any, Any]:
    """The result of the task enqueued on backend ``alias`` as ``result_id``.

    Raises ``TaskResultDoesNotExist`` for an id that is not a task of this backend (never
    committed, another backend's, or pruned). A task whose function a later deploy removed or
    renamed still has its result, with a stand-in task (``_task_or_stand_in``).
    """
    # Imported here: the backend (hence this module) is built by @task, possibly while apps load.
    from composition.jobs.models import DeadLetter, TaskRecord

    try:
        record_id = uuid.UUID(result_id) if isinstance(result_id, str) else None
    except ValueError:
        record_id = None
    if record_id is None:
        raise TaskResultDoesNotExist(result_id)
    # The lease is compared on the database's clock, the one that wrote it; the dead letter (its
    # message id is unique) comes in the same statement.
    dead = DeadLetter.objects.filter(message_id=OuterRef("message_id"))
    record = TaskRecord.objects.filter(pk=record_id, backend=alias).annotate(
        lease_held=ExpressionWrapper(Q(running_until__gt=Now()), output_field=BooleanField()),
        dead_status=Subquery(dead.values("status")[:1]), dead_error_class=Subquery(dead.values("error_class")[:1]),
        dead_traceback=Subquery(dead.values("traceback")[:1]),
        dead_last_failed_at=Subquery(dead.values("last_failed_at")[:1])).first()
    if record is None:
        raise TaskResultDoesNotExist(result_id)
    status = TaskResultStatus(record.status)
    if status == TaskResultStatus.RUNNING and not record.lease_held:
        status = TaskResultStatus.READY
    errors = [TaskError(exception_class_path=str(error.get("exception_class_path", "")),
                        traceback=str(error.get("traceback", "")))
              for error in record.errors if isinstance(error, dict)] if isinstance(record.errors, list) else []
    finished_at = record.finished_at
    dead_status = record.dead_status
    if status in (TaskResultStatus.READY, TaskResultStatus.FAILED) and dead_status is not None:
        if dead_status == DeadLetter.Status.REPLAYED:
            status = TaskResultStatus.READY
        else:
            if status != TaskResultStatus.FAILED:
                # Parked before a run could say so (a deploy's incompatible message).
                errors.append(_task_error(record.dead_error_class, record.dead_traceback))
                finished_at = record.dead_last_failed_at
            status = TaskResultStatus.FAILED
    task = _task_or_stand_in(result_id, record.task_path, alias=alias, queue=record.queue_name,
                             run_after=record.run_after, priority=record.priority)
    workers = record.worker_ids if isinstance(record.worker_ids, list) else []
    result: TaskResult[Any, Any] = TaskResult(
        task=task, id=str(record.pk), status=status, enqueued_at=record.enqueued_at, started_at=record.started_at,
        last_attempted_at=record.last_attempted_at,
        finished_at=finished_at if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED) else None,
        args=record.args if isinstance(record.args, list) else [],
        kwargs=record.kwargs if isinstance(record.kwargs, dict) else {}, backend=alias, errors=errors,
        worker_ids=[str(worker) for worker in workers])
    # As Django's own backends set it.
    object.__setattr__(result, "_return_value", record.return_value if status == TaskResultStatus.SUCCESSFUL else None)
    return result


def _task_or_stand_in(result_id: str, path: str, *, alias: str, queue: str, run_after: datetime | None,
                      priority: int) -> Task[Any, Any]:
    """The task at ``path``; when that no longer names a task (a deploy removed or renamed it), a
    stand-in under the same module path whose call raises ``InvalidTask``, so that the result
    still tells what became of the run (its dead letter, most likely). Raises
    ``TaskResultDoesNotExist`` when not even a stand-in can be built (its queue is gone)."""
    try:
        return resolve_task(path, alias=alias, queue=queue, run_after=run_after, priority=priority)
    except (ImportError, InvalidTask) as exc:
        reason = described(exc)
    module, _, name = path.rpartition(".")

    def gone(*args: Any, **kwargs: Any) -> None:
        raise InvalidTask(f"{path} is no longer a task ({reason})")

    gone.__module__, gone.__name__, gone.__qualname__ = module or "__main__", name or path, name or path
    # Django 6's Task has no default priority (the backport's has).
    fields: dict[str, Any] = {"func": gone, "priority": priority if priority is not None else DEFAULT_TASK_PRIORITY,
                              "backend": alias, "queue_name": queue,
                              "run_after": run_after, "takes_context": False}
    try:
        return Task(**{field.name: fields[field.name] for field in dataclasses.fields(Task) if field.name in fields})
    except InvalidTask as exc:
        raise TaskResultDoesNotExist(f"{result_id}: its task {path} cannot be built any more: {exc}") from None


def _task_error(error_class: str, traceback: str) -> TaskError:
    return TaskError(exception_class_path=exception_class_path(error_class), traceback=traceback or "")
