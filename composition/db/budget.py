"""The database connection budget: how many connections the deployment can open at once, and,
behind a transaction pooler, how many server connections it can hold at once against the pool."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connections

from composition.errors import described

__all__ = ["USABLE_CONNECTIONS_SQL", "BudgetLine", "PoolLimits", "ServerLimits", "connection_budget",
           "connections_per_process", "pool_limits", "server_limits"]


@dataclass(frozen=True)
class BudgetLine:
    """``processes`` processes of one ``role``, each opening ``per_process`` connections and,
    behind a transaction pooler, holding at most ``held_per_process`` server connections at once
    (a connection is held for a transaction, not for the session)."""

    role: str
    processes: int
    per_process: int
    held_per_process: int = 0

    @property
    def total(self) -> int:
        return self.processes * self.per_process

    @property
    def held(self) -> int:
        return self.processes * self.held_per_process

    def as_dict(self) -> dict[str, Any]:
        return {"role": self.role, "processes": self.processes, "per_process": self.per_process,
                "total": self.total, "held_per_process": self.held_per_process, "held": self.held}


def connections_per_process(threads: int, background_threads: int, alias: str = "default") -> int:
    """A process holds one connection per thread that uses the database, or its pool's max_size."""
    pool = connections.settings[alias].get("OPTIONS", {}).get("pool")
    if isinstance(pool, dict) and "max_size" in pool:
        return int(pool["max_size"])
    return threads + background_threads


# What non-superusers may open: max_connections less the reserved ones (reserved_connections
# exists from PostgreSQL 16 on; current_setting(..., true) is NULL before). The sampler's gauge
# reads the same (composition.sampling.database).
USABLE_CONNECTIONS_SQL = """current_setting('max_connections')::int
       - current_setting('superuser_reserved_connections')::int
       - coalesce(current_setting('reserved_connections', true), '0')::int"""
_LIMITS_SQL = f"SELECT current_setting('max_connections')::int, {USABLE_CONNECTIONS_SQL}"


@dataclass(frozen=True)
class ServerLimits:
    """``max_connections``, and ``usable``: what non-superusers may open (less the reserved
    ones), the ceiling a deployment must fit under; ``error`` when the server did not say."""

    max_connections: int | None
    usable: int | None
    error: str | None = None


def server_limits(alias: str = "default") -> ServerLimits:
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute(_LIMITS_SQL)
            max_connections, usable = cursor.fetchone()
            return ServerLimits(int(max_connections), int(usable))
    except Exception as exc:  # the budget still prints; the caller says it could not check it
        return ServerLimits(None, None, described(exc).strip())


@dataclass(frozen=True)
class PoolLimits:
    """A transaction pooler's limits for one database, as PgBouncer's console says them:
    ``pool_size`` server connections (``reserve`` more for clients that waited
    ``reserve_pool_timeout``), ``max_client_conn`` clients; ``error`` when it could not be read."""

    pool_size: int | None
    reserve: int | None = None
    max_client_conn: int | None = None
    error: str | None = None


def pool_limits(alias: str = "default") -> PoolLimits:
    """``alias``'s pool, read from the PgBouncer it connects to (its admin console, the database
    ``pgbouncer``, with the alias's own credentials: they must be in ``admin_users`` or
    ``stats_users``)."""
    import psycopg

    entry = connections.settings[alias]
    try:
        with psycopg.connect(host=entry.get("HOST") or None, port=entry.get("PORT") or None,
                             user=entry.get("USER") or None, password=entry.get("PASSWORD") or None,
                             dbname="pgbouncer", autocommit=True, prepare_threshold=None,
                             connect_timeout=5) as console:
            config = {str(row[0]): str(row[1]) for row in console.execute("SHOW CONFIG").fetchall()}
            cursor = console.execute("SHOW DATABASES")
            names = [column.name for column in cursor.description or ()]
            databases = {row[names.index("name")]: dict(zip(names, row, strict=True)) for row in cursor.fetchall()}
    except Exception as exc:  # a managed pooler may hide its console: the caller says so
        return PoolLimits(None, error=described(exc).strip())
    # The database's row gives its effective sizes; one not connected to yet through a wildcard
    # entry has no row, and gets the defaults.
    database = databases.get(entry.get("NAME"))
    size = int(database["pool_size"] if database else config.get("default_pool_size") or 0) or None
    reserve = int(database["reserve_pool"] if database else config.get("reserve_pool_size") or 0)
    clients = int(config["max_client_conn"]) if config.get("max_client_conn") else None
    return PoolLimits(size, reserve, clients, None if size else "the pooler did not say its pool size")


def connection_budget(lines: list[BudgetLine], limits: ServerLimits, pool: PoolLimits | None = None) -> dict[str, Any]:
    """The budget as ``manage.py system`` prints it. Directly, the connections opened must fit
    the server's usable ones. Behind a transaction pooler (``pool``), the clients must fit its
    ``max_client_conn``, the server connections held at once its pool (or jobs, lease renewals
    and sweeps wait in the pooler's queue), and the pool with its reserve the server."""
    total = sum(line.total for line in lines)
    budget: dict[str, Any] = {
        "lines": [line.as_dict() for line in lines],
        "total": total,
        "max_connections": limits.max_connections,
        "usable_connections": limits.usable,
        "over_budget": limits.usable is not None and total > limits.usable,
        "unchecked": limits.error,
        "pooled": None,
    }
    if pool is not None:
        held = sum(line.held for line in lines)
        servers = None if pool.pool_size is None else pool.pool_size + (pool.reserve or 0)
        budget["pooled"] = {"held_at_once": held, "pool_size": pool.pool_size, "reserve_pool": pool.reserve,
                            "max_client_conn": pool.max_client_conn,
                            "pool_short": pool.pool_size is not None and held > pool.pool_size,
                            "clients_over": pool.max_client_conn is not None and total > pool.max_client_conn}
        budget["over_budget"] = (budget["pooled"]["pool_short"] or budget["pooled"]["clients_over"]
                                 or (limits.usable is not None and servers is not None and servers > limits.usable))
        budget["unchecked"] = limits.error or pool.error
    return budget
