"""The database connection budget: how many connections the deployment can open at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connections

__all__ = ["BudgetLine", "connection_budget", "connections_per_process", "server_max_connections"]


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


def server_max_connections(alias: str = "default") -> int | None:
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute("SHOW max_connections")
            return int(cursor.fetchone()[0])
    except Exception:
        return None


def connection_budget(lines: list[BudgetLine], max_connections: int | None) -> dict[str, Any]:
    total = sum(line.total for line in lines)
    return {
        "lines": [line.as_dict() for line in lines],
        "total": total,
        "max_connections": max_connections,
        # PostgreSQL keeps superuser_reserved_connections (3 by default) for itself.
        "over_budget": max_connections is not None and total > max_connections - 3,
    }
