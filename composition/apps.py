from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.backends.signals import connection_created


class CompositionConfig(AppConfig):
    name = "composition"
    label = "composition"
    verbose_name = "Backend composition"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from composition import checks  # noqa: F401  (registers the system checks)
        from composition.broker import configured_broker
        from composition.logging import configure_structlog

        configure_structlog()
        connection_created.connect(apply_session_timeouts, dispatch_uid="composition-timeouts")
        # The configured broker must exist before any actor is declared; then each app's
        # ``jobs`` module declares its actors against it.
        configured_broker()
        autodiscover_modules("jobs")


def apply_session_timeouts(sender: Any, connection: Any, **_: Any) -> None:
    """Short query and idle-transaction timeouts on every new PostgreSQL connection."""
    if connection.vendor != "postgresql":
        return
    from composition.conf import conf

    statement_ms = int(float(conf.DB_STATEMENT_TIMEOUT_S) * 1000)
    idle_ms = int(float(conf.DB_IDLE_IN_TRANSACTION_TIMEOUT_S) * 1000)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('statement_timeout', %s, false),"
            " set_config('idle_in_transaction_session_timeout', %s, false)",
            [f"{statement_ms}ms", f"{idle_ms}ms"],
        )
