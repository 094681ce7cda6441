"""The ``composition`` Django app: when Django is ready, its checks, logging and connection
receivers are wired, the configured broker is built and each app's ``jobs`` and ``schedules``
modules are imported."""

from __future__ import annotations

import structlog
from django.apps import AppConfig
from django.conf import settings
from django.db.backends.signals import connection_created
from django.db.models.signals import post_migrate, pre_migrate

from composition.db.blocked_calls import remember_connection
from composition.db.slow_queries import count_slow_queries
from composition.db.timeouts import (
    apply_session_timeouts,
    lift_timeouts_for_migrate,
    restore_timeouts_after_migrate,
)
from composition.errors import BrokerConfigurationError


class CompositionConfig(AppConfig):
    name = "composition"
    label = "composition"
    verbose_name = "Backend composition"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from composition import checks  # noqa: F401  (registers the system checks)
        from composition.broker.configured import configured_broker
        from composition.logging import configure_structlog, log_thread_deaths

        configure_structlog()
        log_thread_deaths()
        connection_created.connect(apply_session_timeouts, dispatch_uid="composition-timeouts")
        connection_created.connect(count_slow_queries, dispatch_uid="composition-slow-queries")
        # So a job's time limit can cut a call blocked on a cut network (composition.db.blocked_calls).
        connection_created.connect(remember_connection, dispatch_uid="composition-blocked-calls")
        # Migrations (index builds, data migrations) run without the short session timeouts.
        pre_migrate.connect(lift_timeouts_for_migrate, dispatch_uid="composition-timeouts-migrate")
        post_migrate.connect(restore_timeouts_after_migrate, dispatch_uid="composition-timeouts-migrate")
        # The configured broker must exist before any actor is declared; then each app's
        # ``jobs`` module declares its actors against it.
        try:
            configured_broker()
        except BrokerConfigurationError as exc:
            # No job module can load without it. Left to manage.py check (E003), and raised again by
            # the first @job or publish(): raised here, every command (check, migrate, help) died in
            # a traceback from app loading.
            structlog.get_logger("composition").error("no broker: the jobs are not loaded", error=str(exc))
            return
        autodiscover_modules("jobs")
        # Each app's ``schedules`` module declares its schedules (after its jobs exist).
        autodiscover_modules("schedules")
        from composition.schedules.runs import connect as follow_scheduled_runs

        follow_scheduled_runs()
        # django.tasks (Django 6 sets TASKS by default; the backport reads it too): the actors of
        # each composition.tasks.OutboxBackend, so workers run tasks without importing their modules.
        if getattr(settings, "TASKS", None):
            from composition.tasks.setup import ready as tasks_ready

            tasks_ready()
