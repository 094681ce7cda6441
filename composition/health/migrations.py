"""The readiness check that composition's migrations are applied to the default database.

Loading Django's migration graph reads every app's migration files: too slow for each probe.
Once this process has seen them applied it remembers that and asks no more, since migrations do
not go backwards in normal operation (a rollback with ``migrate composition <earlier>`` is an
operator's deliberate act, followed by a restart). Until then every probe looks again.
"""

from __future__ import annotations

from django.db import connections

from composition.db.schema import check_migrations_applied

__all__ = ["forget_applied_migrations", "probe_migrations"]

# Set once, never cleared but by forget_applied_migrations(): a bool's assignment needs no lock.
_seen_applied = False


def probe_migrations(timeout_s: float) -> None:
    """Raise ``MigrationsNotApplied`` while composition's migrations are not all applied.
    ``timeout_s`` is unused: readiness's deadline abandons this probe as it does the others."""
    global _seen_applied
    if _seen_applied:
        return
    try:
        check_migrations_applied()
    finally:
        # The probe thread's own connection: a probe leaves nothing open.
        connections["default"].close()
    _seen_applied = True


def forget_applied_migrations() -> None:
    """The next probe loads the migration graph again (what ``reset_readiness_cache`` does)."""
    global _seen_applied
    _seen_applied = False
