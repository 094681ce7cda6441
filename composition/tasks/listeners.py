"""What a run shows its listeners: the ``TaskResult`` a task's context and django.tasks'
``task_started``/``task_finished`` receivers see, and the signals sent to every receiver even if
one raises (logged): a run's outcome never depends on a listener.
"""

from __future__ import annotations

import traceback
from typing import Any

import structlog
from django.utils import timezone

from composition.errors import described
from composition.tasks._compat import Task, TaskError, TaskResult, TaskResultStatus, task_finished, task_started
from composition.tasks.records import RunStart

__all__ = ["announce_finished", "announce_started", "error_dict", "running_result", "task_error"]

log = structlog.get_logger("composition.tasks")


def running_result(task: Task[Any, Any], *, record_id: str | None, alias: str, args: list[Any],
                   kwargs: dict[str, Any], worker: str, start: RunStart | None) -> TaskResult[Any, Any]:
    """The result of this run, as its RUNNING write read it back (``start``); with no record (a
    message from before results were kept, a run in-process, or a write that failed), this run
    alone."""
    now = timezone.now()
    if start is None:
        return TaskResult(task=task, id=record_id or "", status=TaskResultStatus.RUNNING, enqueued_at=None,
                          started_at=now, last_attempted_at=now, finished_at=None, args=args,
                          kwargs=kwargs, backend=alias, errors=[], worker_ids=[worker])
    return TaskResult(task=task, id=record_id or "", status=TaskResultStatus.RUNNING,
                      enqueued_at=start.enqueued_at, started_at=start.started_at,
                      last_attempted_at=start.last_attempted_at, finished_at=None, args=args, kwargs=kwargs,
                      backend=alias, worker_ids=[str(worker_id) for worker_id in start.worker_ids],
                      errors=[TaskError(exception_class_path=str(error.get("exception_class_path", "")),
                                        traceback=str(error.get("traceback", "")))
                              for error in start.errors if isinstance(error, dict)])


def task_error(exc: BaseException) -> TaskError:
    cls = type(exc)
    return TaskError(exception_class_path=f"{cls.__module__}.{cls.__qualname__}",
                     traceback="".join(traceback.format_exception(exc)))


def error_dict(error: TaskError) -> dict[str, str]:
    """``error`` as a result record keeps it."""
    return {"exception_class_path": error.exception_class_path, "traceback": error.traceback}


def announce_started(task: Task[Any, Any], result: TaskResult[Any, Any]) -> None:
    """Send ``task_started`` for ``result``."""
    for receiver, response in task_started.send_robust(sender=type(task.get_backend()), task_result=result):
        if isinstance(response, Exception):
            log.error("a task_started listener raised", error=described(response),
                      listener=getattr(receiver, "__qualname__", repr(receiver)))


def announce_finished(result: TaskResult[Any, Any], status: TaskResultStatus) -> None:
    """Send ``task_finished`` for ``result`` with ``status``: the task's outcome is decided already."""
    now = timezone.now()
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", now)
    for receiver, response in task_finished.send_robust(sender=type(result.task.get_backend()), task_result=result):
        if isinstance(response, Exception):
            log.error("a task_finished listener raised", listener=getattr(receiver, "__qualname__", repr(receiver)),
                      status=str(status), error=described(response))
