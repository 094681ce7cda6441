"""A task in an outbox payload, and back: ``{"task": module path, "args": [...], "kwargs": {...},
"result": its result id}``.

The worker finds the task by its module path (``django.tasks``' ``Task.module_path``), so a task
must be importable under the name of its function, as ``@task`` at module level makes it. The
arguments are checked against the function's signature with the jobs' ``PayloadSchema`` (names,
and JSON types where annotated): by ``enqueue()`` before anything is written, and again by the
worker, which may run a newer deploy than the one that enqueued.
"""

from __future__ import annotations

import functools
import inspect
from datetime import datetime
from typing import Any

from django.utils.module_loading import import_string

from composition.errors import IncompatibleMessageError, PayloadValidationError
from composition.jobs.schema import PayloadSchema
from composition.tasks._compat import InvalidTask, Task

__all__ = ["TASK_KEYS", "arguments_schema", "fitting_task", "is_importable", "resolve_task", "task_payload"]

TASK_KEYS = ("task", "args", "kwargs")


def task_payload(task: Task[Any, Any], args: list[Any], kwargs: dict[str, Any], result_id: str) -> dict[str, Any]:
    """The outbox payload of ``task`` enqueued as result ``result_id`` (a replay sends it again)."""
    return {"task": task.module_path, "args": args, "kwargs": kwargs, "result": result_id}


def resolve_task(path: str, *, alias: str, queue: str, run_after: datetime | None = None,
                 priority: int | None = None) -> Task[Any, Any]:
    """The task at ``path``, as enqueued on backend ``alias`` and ``queue``.

    Raises ImportError when ``path`` names nothing (a module or task renamed since), and
    ``InvalidTask`` when it names something that is not a task.
    """
    found = import_string(path)
    if not isinstance(found, Task):
        raise InvalidTask(f"{path} is not a django.tasks Task (is the function decorated with @task?)")
    # using() validates again, against this backend: a queue it no longer serves is refused.
    if priority is None:
        return found.using(queue_name=queue, backend=alias, run_after=run_after)
    return found.using(queue_name=queue, backend=alias, run_after=run_after, priority=priority)


def fitting_task(path: Any, args: Any, kwargs: Any, *, alias: str, queue: str,
                 priority: int | None = None) -> Task[Any, Any]:
    """The task a worker runs for a payload (enqueued with ``priority``), once its arguments fit;
    raises ``IncompatibleMessageError`` when the running code has no such task or they do not fit
    (from the ``ImportError`` or ``InvalidTask``, whose traceback the dead letter keeps)."""
    if not isinstance(path, str) or not isinstance(args, list) or not isinstance(kwargs, dict):
        raise IncompatibleMessageError(f"not a task payload ({', '.join(TASK_KEYS)})")
    try:
        task = resolve_task(path, alias=alias, queue=queue, priority=priority)
    except (ImportError, InvalidTask) as exc:
        raise IncompatibleMessageError(f"task {path}: {exc}") from exc
    try:
        arguments_schema(task).validate(args, kwargs)
    except PayloadValidationError as exc:
        raise IncompatibleMessageError(str(exc)) from None
    return task


def arguments_schema(task: Task[Any, Any]) -> PayloadSchema:
    """The schema of the arguments ``enqueue()`` passes: the function's, less ``context`` for a
    task that takes it (the worker supplies that one)."""
    return _schema(task.func, task.module_path, task.takes_context)


@functools.lru_cache(maxsize=1024)
def _schema(func: Any, name: str, takes_context: bool) -> PayloadSchema:
    schema = PayloadSchema.of(func, name)
    if not takes_context:
        return schema
    parameters = list(schema.signature.parameters.values())
    context = parameters[0].name
    return PayloadSchema(name, schema.signature.replace(parameters=parameters[1:]),
                         {key: check for key, check in schema.checks.items() if key != context})


def is_importable(task: Task[Any, Any]) -> bool:
    """Whether ``task`` is found again at its module path (what the worker will import)."""
    try:
        found = import_string(task.module_path)
    except ImportError:
        return False
    return isinstance(found, Task) and found.func is task.func and inspect.isfunction(task.func)
