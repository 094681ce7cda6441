"""``django.tasks`` tasks used only by tests/tasks/test_backend.py, on the ``composition.tasks.OutboxBackend``
of tests/settings.py. Workers never import this module by themselves: the task actor imports
each task by its module path when it runs it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from composition.jobs import PermanentError
from tests.jobsapp.models import Account, Attempt, Effect

try:
    from django.tasks import TaskContext, task
    from django.tasks.signals import task_finished
except ImportError:  # Django 5.2: the backport
    from django_tasks import TaskContext, task  # type: ignore[no-redef]
    from django_tasks.signals import task_finished  # type: ignore[no-redef]

QUEUE = "jobs_tasks"
PLAIN_QUEUE = "jobs_tasks_plain"  # ATOMIC: False in tests/settings.py
# How long blocks_until_released waits at most, well inside the queue's TIMEOUT_S.
BLOCK_MAX_S = 15.0


@task(queue_name=QUEUE)
def add_effect(key: str) -> None:
    Effect.objects.create(key=key)


@task(queue_name=PLAIN_QUEUE)
def add_effect_plain(key: str) -> str:
    Effect.objects.create(key=key)
    return key  # kept: the result's return_value


@task(queue_name=QUEUE, takes_context=True)
def flaky(context: TaskContext, key: str, fail_times: int) -> None:
    """Fails its first ``fail_times`` attempts; then records which attempt and result id it saw."""
    if context.attempt <= fail_times:
        raise ValueError(f"attempt {context.attempt} of {key} fails")
    Effect.objects.create(key=f"{key}:attempt={context.attempt}:id={context.task_result.id}")


@task(queue_name=QUEUE)
def always_fails(key: str) -> None:
    raise ValueError(f"{key} always fails")


@task(queue_name=QUEUE)
def refuses(key: str) -> None:
    raise PermanentError(f"{key} can never work")


@task(queue_name=PLAIN_QUEUE)
def needs_account(key: str) -> None:
    """Fails (transiently) until the account named ``key`` exists; counts its runs."""
    Attempt.objects.create(key=key, attempt=Attempt.objects.filter(key=key).count() + 1)
    if not Account.objects.filter(name=key).exists():
        raise LookupError(f"no account {key}")
    Effect.objects.create(key=key)


@task(queue_name=QUEUE)
def blocks_until_released(key: str) -> None:
    """Runs until the account ``release-<key>`` exists (the test's signal), then records its effect."""
    deadline = time.monotonic() + BLOCK_MAX_S
    while not Account.objects.filter(name=f"release-{key}").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{key} was never released")
        time.sleep(0.05)
    Effect.objects.create(key=key)


@task(queue_name=QUEUE)
def typed(n: int, tags: list[str] | None = None) -> None:
    Effect.objects.create(key=f"typed-{n}")


@task(queue_name=QUEUE)
def overruns(key: str, run_s: float) -> None:
    """Works ``run_s`` seconds in short steps (a time limit interrupts between them, not inside a
    long sleep), then records its effect: an interrupted run leaves none."""
    deadline = time.monotonic() + run_s
    while time.monotonic() < deadline:
        time.sleep(0.05)
    Effect.objects.create(key=key)


@task(queue_name=QUEUE)
def duplicates_account(key: str) -> None:
    """Fails with the database's own error: the second row breaks the unique name."""
    Account.objects.create(name=key)
    Account.objects.create(name=key)


def _record_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
    """What a project's task_finished listener might do: write a row (an audit, a notification).
    For the tasks of this module whose name says so only, so the other tests' rows stay theirs."""
    if task_result.task.func.__module__ == __name__ and task_result.task.name in LISTENED:
        Effect.objects.create(key=f"finished:{task_result.task.name}:{task_result.status}")
        if task_result.task.name == "refuses":
            raise RuntimeError("a listener that fails must not change the task's recorded error")


LISTENED = {"duplicates_account", "refuses", "add_effect"}
task_finished.connect(_record_finished)


@task(queue_name=QUEUE, takes_context=True)
def needs_account_in_context(context: TaskContext, key: str) -> None:
    """Fails until the account ``key`` exists; then records the attempt and result id it saw."""
    if not Account.objects.filter(name=key).exists():
        raise LookupError(f"no account {key}")
    Effect.objects.create(key=f"{key}:attempt={context.attempt}:id={context.task_result.id}")


# Coroutine tasks: run by the worker in an event loop of their own, their ORM calls on the worker
# thread's connection (inside the ledger's transaction), within the queue's time limit.
@task(queue_name=QUEUE)
async def add_effect_async(key: str) -> None:
    await asyncio.sleep(0.01)
    await Effect.objects.acreate(key=key)


@task(queue_name=QUEUE, takes_context=True)
async def flaky_async(context: TaskContext, key: str, fail_times: int) -> None:
    await Effect.objects.acreate(key=f"{key}:tried={context.attempt}")  # rolled back with a failed run
    if context.attempt <= fail_times:
        raise ValueError(f"attempt {context.attempt} of {key} fails")
    await Effect.objects.acreate(key=f"{key}:attempt={context.attempt}")


@task(queue_name=QUEUE)
async def overruns_async(key: str, run_s: float) -> None:
    """Writes its effect, then awaits past the time limit: the effect must roll back."""
    await Effect.objects.acreate(key=key)
    await asyncio.sleep(run_s)


@task(queue_name=QUEUE)
def returns(key: str, padding: int = 0) -> Any:
    """Returns JSON (``padding`` characters of it more), or, for ``key`` "a set", a set."""
    Effect.objects.create(key=key)
    if key == "a set":
        return {1, 2}
    return {"key": key, "padding": "x" * padding, "pair": (1, 2)}
