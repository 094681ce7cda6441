"""What ``composition``'s ``ready()`` does for ``django.tasks``: declare the task actors of every
``OutboxBackend`` in ``settings.TASKS``, and register the system check of those backends.

Every process declares them, as it declares the jobs of each app's ``jobs`` module, so a
``runworkers`` process consumes the tasks' queues without importing any tasks module.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.utils.module_loading import import_string

from composition.tasks._compat import BACKPORT, BACKPORT_APP, task_backends
from composition.tasks.backend import OutboxBackend
from composition.tasks.errors import InvalidBackendOptions

__all__ = ["check_outbox_backends", "outbox_aliases", "ready"]


def ready() -> None:
    """Declare the actors of each valid ``OutboxBackend`` (an invalid one is left to the check)
    and register ``check_outbox_backends``."""
    checks.register(check_outbox_backends, "composition")
    for alias in outbox_aliases():
        try:
            backend = task_backends[alias]
        except InvalidBackendOptions:
            continue
        if isinstance(backend, OutboxBackend):
            backend.declare_actors()


def check_outbox_backends(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``composition.E090`` for an ``OutboxBackend`` with bad ``QUEUES``/``OPTIONS``;
    ``composition.W091`` when it runs on the backport and ``django_tasks`` is not installed."""
    messages: list[checks.CheckMessage] = []
    aliases = outbox_aliases()
    for alias in aliases:
        try:
            task_backends[alias]
        except InvalidBackendOptions as exc:
            messages.append(checks.Error(str(exc), hint="See docs/tasks.md, 'Options'.",
                                         id="composition.E090"))
    if aliases and BACKPORT and not apps.is_installed(BACKPORT_APP):
        messages.append(checks.Warning(
            f"composition.tasks.OutboxBackend runs on the django-tasks backport, whose app {BACKPORT_APP!r} "
            "is not in INSTALLED_APPS: its checks do not run and override_settings(TASKS=...) is not seen.",
            hint=f"Add {BACKPORT_APP!r} to INSTALLED_APPS (not needed on Django 6).", id="composition.W091"))
    return messages


def outbox_aliases() -> list[str]:
    """The aliases in ``settings.TASKS`` whose backend class is an ``OutboxBackend``. A backend
    that cannot be imported is left to django.tasks, which reports it when it is used."""
    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, dict):
        return []
    aliases = []
    for alias, params in configured.items():
        try:
            backend_class = import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue
        if isinstance(backend_class, type) and issubclass(backend_class, OutboxBackend):
            aliases.append(alias)
    return aliases
