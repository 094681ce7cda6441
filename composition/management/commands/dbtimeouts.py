"""``manage.py dbtimeouts``: give a database's role the library's timeouts, where the library sets
none per session (a database behind a transaction pooler)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from composition.db.pooling import timeout_settings, timeout_statements


class Command(BaseCommand):
    help = ("Print, or run with --apply, the ALTER ROLE statements that give the database's role the "
            "statement and idle-in-transaction timeouts (DB_STATEMENT_TIMEOUT_S, "
            "DB_IDLE_IN_TRANSACTION_TIMEOUT_S). Behind a transaction pooler the library sets none per "
            "session; new sessions get them from the role.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS, help="the DATABASES alias (default: default)")
        parser.add_argument("--apply", action="store_true", help="run the statements instead of printing them")

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"]
        if alias not in connections:
            raise CommandError(f"no DATABASES alias {alias!r}")
        if connections[alias].vendor != "postgresql":
            raise CommandError(f"DATABASES[{alias!r}] is not PostgreSQL")
        statements = timeout_statements(alias)
        if not options["apply"]:
            self.stdout.write("\n".join(statements))
            return
        try:
            with connections[alias].cursor() as cursor:
                for statement in statements:
                    cursor.execute(statement)
        except DatabaseError as exc:
            # A role may set its own defaults; another role's takes a superuser or CREATEROLE.
            raise CommandError(f"the role's timeouts were not set: {exc}".strip()) from exc
        wanted = ", ".join(f"{name} = {value}" for name, value in timeout_settings().items())
        self.stdout.write(f"set for the role of DATABASES[{alias!r}]: {wanted}. New sessions get them; a "
                          "pooler's open server connections keep what they had until they are replaced "
                          "(PgBouncer: RECONNECT in its console, or server_lifetime).")
