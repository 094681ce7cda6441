"""The replay half of ``composition.cache.invalidation.Invalidations``: apply the invalidations
recorded as pending rows (deferred during a Redis outage, or left by a process that died after
COMMIT), on every database that may hold them, and delete the rows."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import structlog
from django.db import DatabaseError, connections, router, transaction

from composition.metrics import CACHE_INVALIDATIONS

__all__ = ["ReplaysPending"]

log = structlog.get_logger("composition.cache")


class ReplaysPending:
    """Mixed into ``Invalidations``, whose attributes and appliers it uses."""

    alias: str
    client: Any
    db_alias: str
    _replayed_databases: list[str] | None

    def _apply(self, client: Any, kind: str, target: str) -> None:
        raise NotImplementedError

    def _applied(self, items: Iterable[tuple[str, str]]) -> None:
        raise NotImplementedError

    def replay_pending(self, *, batch: int = 500) -> int:
        """Apply every recorded invalidation of this alias, oldest first, and delete its rows;
        returns how many rows.

        Each round claims up to ``batch`` rows with ``FOR UPDATE SKIP LOCKED``, applies them in one
        pipeline (a key or namespace recorded many times is applied once) and deletes them in the
        same transaction, so a concurrent replayer (or a writer deleting its own rows) skips them
        instead of applying them twice or waiting. The lock is held only for that one bounded
        Redis round trip (the client's socket timeout). Raises the Redis or database error that
        stopped it on the engine's database; the claimed rows are released for the next attempt.

        Rows recorded on another database (``invalidate(key, using="other")`` writes them in that
        database's transaction) are replayed there too, on every database whose router takes the
        table and that has it; an error there (a read-only replica) is logged, not raised, so it
        never keeps the cache's breaker open.
        """
        total = self._replay_on(self.db_alias, batch)
        for db_alias in self._other_databases():
            try:
                total += self._replay_on(db_alias, batch)
            except DatabaseError as exc:
                log.warning("cache invalidations recorded on another database could not be replayed",
                            alias=self.alias, database=db_alias, error=str(exc))
        return total

    def _other_databases(self) -> list[str]:
        """The other databases that may hold pending rows: looked up once per engine (the
        introspection is a query per database)."""
        if self._replayed_databases is None:
            from composition.cache.models import PendingInvalidation  # late: needs the app registry

            found = []
            for db_alias in connections:
                if db_alias == self.db_alias or not router.allow_migrate_model(db_alias, PendingInvalidation):
                    continue
                try:
                    with connections[db_alias].cursor() as cursor:
                        tables = connections[db_alias].introspection.table_names(cursor)
                except DatabaseError:
                    continue  # unreachable now; looked at again by the next engine
                if PendingInvalidation._meta.db_table in tables:
                    found.append(db_alias)
            self._replayed_databases = found
        return self._replayed_databases

    def _replay_on(self, db_alias: str, batch: int) -> int:
        from composition.cache.models import PendingInvalidation  # late: needs the app registry

        rows = PendingInvalidation.objects.using(db_alias).filter(alias=self.alias)
        total = 0
        while True:
            with transaction.atomic(using=db_alias):
                claimed = list(rows.order_by("id").select_for_update(skip_locked=True)
                               .values_list("id", "kind", "target")[:batch])
                if not claimed:
                    return total
                pipe = self.client.pipeline(transaction=False)
                for kind, target in dict.fromkeys((kind, target) for _, kind, target in claimed):
                    self._apply(pipe, kind, target)
                pipe.execute()
                self._applied((kind, target) for _, kind, target in claimed)
                rows.filter(id__in=[row[0] for row in claimed]).delete()
            total += len(claimed)
            CACHE_INVALIDATIONS.labels("replayed").inc(len(claimed))
