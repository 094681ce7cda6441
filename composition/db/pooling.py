"""Databases behind a transaction pooler (PgBouncer's ``pool_mode=transaction``).

There each transaction may run on another server connection, and a session setting lands on the
one that served it: lost for the next transaction, inherited by the pooler's next client. For an
alias in ``TRANSACTION_POOLED_DATABASES`` the library sets nothing per session: its timeouts are
the role's or the database's (``timeout_statements``), and ``migrate`` runs on a direct connection.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.db import connections

from composition.conf import conf

__all__ = ["check_pooled_settings", "check_pooled_timeouts", "is_transaction_pooled", "timeout_settings",
           "timeout_statements"]


def is_transaction_pooled(alias: str) -> bool:
    """Whether ``alias`` is declared to sit behind a transaction pooler."""
    return alias in (conf.TRANSACTION_POOLED_DATABASES or ())


def timeout_settings() -> dict[str, str]:
    """The server settings the library wants on every connection, as ``SHOW`` spells them set
    in milliseconds."""
    return {"statement_timeout": f"{int(float(conf.DB_STATEMENT_TIMEOUT_S) * 1000)}ms",
            "idle_in_transaction_session_timeout": f"{int(float(conf.DB_IDLE_IN_TRANSACTION_TIMEOUT_S) * 1000)}ms"}


def timeout_statements(alias: str) -> list[str]:
    """``ALTER ROLE … SET`` statements giving ``alias``'s role the timeouts, to run once (as a
    superuser or the role itself; ``manage.py dbtimeouts --apply``); new sessions get them."""
    role = connections[alias].settings_dict.get("USER") or "CURRENT_USER"
    quoted = role if role == "CURRENT_USER" else connections[alias].ops.quote_name(role)
    return [f"ALTER ROLE {quoted} SET {name} = '{value}';" for name, value in timeout_settings().items()]


def check_pooled_settings(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    """What a transaction-pooled alias's ``DATABASES`` entry must say (no database access)."""
    messages: list[CheckMessage] = []
    pooled = conf.TRANSACTION_POOLED_DATABASES
    if not isinstance(pooled, list | tuple) or not all(isinstance(alias, str) for alias in pooled):
        return [Error(f"COMPOSITION['TRANSACTION_POOLED_DATABASES'] must be a list of DATABASES aliases, "
                      f"got {pooled!r}.", id="composition.E150")]
    for alias in pooled:
        entry = settings.DATABASES.get(alias)
        if entry is None:
            messages.append(Error(f"COMPOSITION['TRANSACTION_POOLED_DATABASES'] names {alias!r}, which is not in "
                                  "DATABASES.", id="composition.E150"))
            continue
        options = entry.get("OPTIONS") or {}
        if not entry.get("DISABLE_SERVER_SIDE_CURSORS"):
            messages.append(Error(
                f"DATABASES[{alias!r}] is transaction-pooled: set DISABLE_SERVER_SIDE_CURSORS = True.",
                hint="A server-side cursor lives in a session; behind the pooler the next fetch may reach "
                     "another server connection.", id="composition.E151"))
        if "options" in options:
            messages.append(Error(
                f"DATABASES[{alias!r}]['OPTIONS']['options'] is set, but the database is transaction-pooled.",
                hint="PgBouncer refuses that startup parameter (or drops it when told to ignore it); give the "
                     "role or the database the settings instead (docs/deployment.md, 'Behind PgBouncer').",
                id="composition.E152"))
        if options.get("server_side_binding"):
            messages.append(Error(
                f"DATABASES[{alias!r}]['OPTIONS']['server_side_binding'] is on, but the database is "
                "transaction-pooled.",
                hint="Server-side binding prepares statements in a session. Django already turns psycopg's "
                     "automatic preparing off.", id="composition.E153"))
        if options.get("assume_role"):
            messages.append(Error(
                f"DATABASES[{alias!r}]['OPTIONS']['assume_role'] is set, but the database is transaction-pooled.",
                hint="Django runs SET ROLE once per connection: behind the pooler the role stays on the server "
                     "connection for its next clients, and this client's next transaction may run without "
                     "it. Connect as that role (USER) instead.", id="composition.E155"))
    return messages


def check_pooled_timeouts(app_configs: Any = None, databases: Any = None, **_: Any) -> list[CheckMessage]:
    """``Tags.database``: each transaction-pooled alias checked (in ``databases``) has the
    library's timeouts from its role or database, read with ``SHOW`` through the pooler."""
    messages: list[CheckMessage] = []
    for alias in databases or ():
        if not is_transaction_pooled(alias) or connections[alias].vendor != "postgresql":
            continue
        with connections[alias].cursor() as cursor:
            found = {}
            for name in timeout_settings():
                cursor.execute(f"SHOW {name}")
                found[name] = str(cursor.fetchone()[0])
        wanted = timeout_settings()
        differ = {name: found[name] for name in wanted if _ms(found[name]) != _ms(wanted[name])}
        if differ:
            messages.append(Warning(
                f"DATABASES[{alias!r}] is transaction-pooled and its sessions start with {differ}, not "
                f"{ {name: wanted[name] for name in differ} }: the library sets no session setting there.",
                hint="Run manage.py dbtimeouts --apply, or: " + " ".join(timeout_statements(alias)),
                id="composition.W154"))
    return messages


_UNITS_MS = {"ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _ms(value: str) -> float | None:
    """A duration as ``SHOW`` prints it ("30s", "1min", "0") in milliseconds; None if unreadable."""
    digits = value.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = value[len(digits):] or "ms"
    try:
        return float(digits) * _UNITS_MS[unit]
    except (KeyError, ValueError):
        return None
