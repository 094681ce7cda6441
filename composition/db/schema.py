"""Whether composition's migrations are applied to a database, read with Django's
``MigrationExecutor`` as ``showmigrations`` and ``runserver``'s warning read it (an undocumented
class: docs/architecture.md lists it, tests/core/test_internals.py checks it).

A process whose code expects columns the database lacks fails at its first query, far from the
cause; ``runworkers`` and readiness ask here first. This module never migrates anything.
"""

from __future__ import annotations

from django.db import connections
from django.db.migrations.executor import MigrationExecutor

from composition.errors import MigrationsNotApplied

__all__ = ["APP_LABEL", "check_migrations_applied", "unapplied_migrations"]

APP_LABEL = "composition"


def unapplied_migrations(alias: str = "default") -> list[str]:
    """The names of composition's migrations not applied to ``alias``, in the order ``migrate``
    would apply them; empty when the schema is current. Raises what the database raises when it
    cannot be reached."""
    executor = MigrationExecutor(connections[alias])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [migration.name for migration, backwards in plan
            if migration.app_label == APP_LABEL and not backwards]


def check_migrations_applied(alias: str = "default") -> None:
    """Raise ``MigrationsNotApplied`` naming the migrations ``migrate`` has yet to apply."""
    missing = unapplied_migrations(alias)
    if missing:
        raise MigrationsNotApplied(missing)
