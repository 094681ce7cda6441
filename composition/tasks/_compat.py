"""``django.tasks`` (Django 6) or its backport ``django_tasks`` (Django 5.2), under one set of names.

The two spell some names differently and keep ``normalize_json`` in different modules; everything
the backend needs is imported here once, so the rest of the package never asks which one it runs
on. Django's own package wins when both are installed; the type checker sees Django's names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from composition.errors import ConfigurationError

__all__ = [
    "BACKPORT",
    "BACKPORT_APP",
    "DEFAULT_TASK_PRIORITY",
    "DEFAULT_TASK_QUEUE_NAME",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]

# The app the backport needs in INSTALLED_APPS (its system checks and its setting_changed reset).
BACKPORT_APP = "django_tasks"

if TYPE_CHECKING:
    from django.tasks import DEFAULT_TASK_QUEUE_NAME, Task, TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import DEFAULT_TASK_PRIORITY, TaskError
    from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    BACKPORT: bool
else:
    try:
        from django.tasks import (
            DEFAULT_TASK_QUEUE_NAME,
            Task,
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task_backends,
        )
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import DEFAULT_TASK_PRIORITY, TaskError
        from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json

        BACKPORT = False
    except ImportError:
        try:
            from django_tasks import (
                DEFAULT_TASK_QUEUE_NAME,
                TaskContext,
                TaskResult,
                TaskResultStatus,
                task_backends,
            )
            from django_tasks.backends.base import BaseTaskBackend
            from django_tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskError
            from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
            from django_tasks.exceptions import InvalidTaskError as InvalidTask
            from django_tasks.exceptions import TaskResultDoesNotExist
            from django_tasks.signals import task_enqueued, task_finished, task_started
            from django_tasks.utils import normalize_json
        except ImportError as exc:
            raise ConfigurationError(
                "composition.tasks needs django.tasks (Django 6) or the django-tasks backport: "
                "install the package's tasks extra (from a clone: pip install './django-backend-composition[tasks]') "
                "or pip install 'django-tasks>=0.12,<0.13'"
            ) from exc

        BACKPORT = True
