"""Which database errors pass: worth trying the same write again later, rather than giving up on it
as one that would fail the same way every time (a constraint, bad data, a missing table)."""

from __future__ import annotations

from django.db import DatabaseError, InterfaceError, OperationalError

__all__ = ["is_passing"]

# read_only_sql_transaction: a primary demoted in a failover, or a pooler still pointing at a
# standby during a switchover. psycopg raises it as an InternalError.
_READ_ONLY = "25006"


def is_passing(exc: BaseException) -> bool:
    """True for a lost, refused or shut-down connection (``OperationalError``,
    ``InterfaceError``) and for a server that is read-only for now."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    return isinstance(exc, DatabaseError) and getattr(exc.__cause__, "sqlstate", None) == _READ_ONLY
