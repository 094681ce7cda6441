"""The database connection budget: how many connections the deployment can open at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connections

from composition.errors import described

__all__ = ["USABLE_CONNECTIONS_SQL", "BudgetLine", "ServerLimits", "connection_budget", "connections_per_process",
           "server_limits"]


@dataclass(frozen=True)
class BudgetLine:
    role: str
    processes: int
    per_process: int

    @property
    def total(self) -> int:
        return self.processes * self.per_process

    def as_dict(self) -> dict[str, Any]:
        return {"role": self.role, "processes": self.processes, "per_process": self.per_process,
                "total": self.total}


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


def connection_budget(lines: list[BudgetLine], limits: ServerLimits) -> dict[str, Any]:
    total = sum(line.total for line in lines)
    return {
        "lines": [line.as_dict() for line in lines],
        "total": total,
        "max_connections": limits.max_connections,
        "usable_connections": limits.usable,
        "over_budget": limits.usable is not None and total > limits.usable,
        "unchecked": limits.error,
    }
