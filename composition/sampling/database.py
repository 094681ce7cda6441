"""The database's side: connections in use against the server's limit, and deadlocks.

``pg_stat_activity`` lists every backend of the server; connections are counted server-wide
because ``max_connections`` is a server-wide limit, whichever database a client uses. A role
without ``pg_read_all_stats`` sees other roles' sessions without their state: those count as
``other``, still in the total.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS, connections

from composition.db.budget import USABLE_CONNECTIONS_SQL

__all__ = ["CONNECTION_STATES", "DatabaseSample", "sample_database"]

# Every state is always reported (0 when none), so a state that empties does not keep its
# last value on a dashboard.
CONNECTION_STATES = ("active", "idle", "idle_in_transaction", "other")
_STATE_OF = {
    "active": "active",
    "idle": "idle",
    "idle in transaction": "idle_in_transaction",
    "idle in transaction (aborted)": "idle_in_transaction",
}

_CONNECTIONS_SQL = """
SELECT state, count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' GROUP BY state
"""
_LIMITS_SQL = f"""
SELECT {USABLE_CONNECTIONS_SQL},
       coalesce((SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()), 0)
"""


@dataclass(frozen=True)
class DatabaseSample:
    """``connections``: client connections by state (``CONNECTION_STATES``); ``usable``: what
    non-superusers may open (max_connections less the reserved ones); ``deadlocks``: detected in
    this database since its statistics were reset (a cumulative count)."""

    connections: dict[str, int]
    usable: int
    deadlocks: int

    @property
    def in_use(self) -> int:
        return sum(self.connections.values())


def sample_database(alias: str = DEFAULT_DB_ALIAS) -> DatabaseSample:
    """Two cheap catalogue reads on the calling thread's connection to ``alias``. Raises the
    database's errors."""
    by_state = dict.fromkeys(CONNECTION_STATES, 0)
    with connections[alias].cursor() as cursor:
        cursor.execute(_CONNECTIONS_SQL)
        for state, count in cursor.fetchall():
            by_state[_STATE_OF.get(state, "other")] += int(count)
        cursor.execute(_LIMITS_SQL)
        usable, deadlocks = cursor.fetchone()
    return DatabaseSample(connections=by_state, usable=int(usable), deadlocks=int(deadlocks))
