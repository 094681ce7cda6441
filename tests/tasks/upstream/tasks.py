"""The upstream tests' task functions (``tests/tasks.py``, the same file in django-tasks 0.12.0 and
django-tasks-db 0.12.0), on this folder's backend: ``@task()`` became
``@task(backend=ALIAS, queue_name=QUEUE)``. ``noop_task_from_bare_decorator`` became the plain
``noop_function`` (a bare ``@task`` binds the "default" alias and queue, which are not ours: the
test decorates it under a backend that has them), and ``hang``, used only by tests left out, went.
"""

import time
from typing import Any

from tests.tasks.upstream import ALIAS, QUEUE
from tests.tasks.upstream.compat import TaskContext, task


@task(backend=ALIAS, queue_name=QUEUE)
def noop_task(*args: Any, **kwargs: Any) -> None:
    return None


def noop_function(*args: Any, **kwargs: Any) -> None:
    return None


@task(backend=ALIAS, queue_name=QUEUE)
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    return None


@task(backend=ALIAS, queue_name=QUEUE)
def calculate_meaning_of_life() -> int:
    return 42


@task(backend=ALIAS, queue_name=QUEUE)
def failing_task_value_error() -> None:
    raise ValueError("This task failed due to ValueError")


@task(backend=ALIAS, queue_name=QUEUE)
def failing_task_system_exit() -> None:
    raise SystemExit("This task failed due to SystemExit")


@task(backend=ALIAS, queue_name=QUEUE)
def failing_task_keyboard_interrupt() -> None:
    raise KeyboardInterrupt("This task failed due to KeyboardInterrupt")


@task(backend=ALIAS, queue_name=QUEUE)
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@task(backend=ALIAS, queue_name=QUEUE)
def complex_return_value() -> Any:
    # Return something which isn't JSON serializable nor picklable
    return lambda: True


@task(backend=ALIAS, queue_name=QUEUE)
def exit_task() -> None:
    exit(1)


@task(backend=ALIAS, queue_name=QUEUE)
def sleep_for(seconds: float) -> None:
    time.sleep(seconds)


@task(backend=ALIAS, queue_name=QUEUE, takes_context=True)
def get_task_id(context: TaskContext) -> str:
    return context.task_result.id


@task(backend=ALIAS, queue_name=QUEUE, takes_context=True)
def test_context(context: TaskContext, attempt: int) -> None:
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt
