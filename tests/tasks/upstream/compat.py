"""``django.tasks`` (Django 6) or the ``django-tasks`` backport (Django 5.2), under the backport's
names, which the upstream tests use: the tests run on whichever package the backend runs on
(``composition.tasks._compat`` picks the same one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = [
    "LOGGER_NAME",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "ImmediateBackend",
    "InvalidTaskBackendError",
    "InvalidTaskError",
    "Task",
    "TaskContext",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "task",
    "task_backends",
    "task_enqueued",
]

if TYPE_CHECKING:
    from django.tasks import Task, TaskContext, TaskResultStatus, task, task_backends
    from django.tasks.backends.immediate import ImmediateBackend
    from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import InvalidTaskBackend as InvalidTaskBackendError
    from django.tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued

    LOGGER_NAME: str
else:
    try:
        from django.tasks import Task, TaskContext, TaskResultStatus, task, task_backends
        from django.tasks.backends.immediate import ImmediateBackend
        from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY
        from django.tasks.exceptions import InvalidTask as InvalidTaskError
        from django.tasks.exceptions import InvalidTaskBackend as InvalidTaskBackendError
        from django.tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
        from django.tasks.signals import task_enqueued

        LOGGER_NAME = "django.tasks"
    except ImportError:
        from django_tasks import TaskContext, TaskResultStatus, task, task_backends
        from django_tasks.backends.immediate import ImmediateBackend
        from django_tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task
        from django_tasks.exceptions import (
            InvalidTaskBackendError,
            InvalidTaskError,
            TaskResultDoesNotExist,
            TaskResultMismatch,
        )
        from django_tasks.signals import task_enqueued

        LOGGER_NAME = "django_tasks"
