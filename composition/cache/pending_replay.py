"""The replay half of ``composition.cache.invalidation.Invalidations``: apply the invalidations
recorded as pending rows (deferred during a Redis outage, or left by a process that died after
COMMIT), on every database that may hold them, and delete the rows; and the catch-up of a process
whose own invalidations could not be applied (``catch_up``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

import structlog
from django.db import DatabaseError, connections, router, transaction

from composition.breaker import CircuitBreaker
from composition.errors import REDIS_ERRORS
from composition.metrics import CACHE_INVALIDATIONS

__all__ = ["CATCH_UP_INTERVAL_S", "REPLAY_ERRORS", "ReplaysPending"]

log = structlog.get_logger("composition.cache")

# How often a read of a key this process could not invalidate tries the replay itself.
CATCH_UP_INTERVAL_S = 0.5
# What a replay raises when Redis or the database fails it.
REPLAY_ERRORS: tuple[type[BaseException], ...] = (*REDIS_ERRORS, DatabaseError)


class ReplaysPending:
    """Mixed into ``Invalidations``, whose attributes and appliers it uses."""

    alias: str
    client: Any
    db_alias: str
    breaker: CircuitBreaker
    _replayed_databases: list[str] | None
    _unapplied: dict[tuple[str, str], int]
    _unapplied_lock: threading.Lock
    _catch_up_after: float

    def _apply(self, client: Any, kind: str, target: str) -> None:
        raise NotImplementedError

    def _applied(self, items: Iterable[tuple[str, str]]) -> None:
        raise NotImplementedError

    def catch_up(self) -> None:
        """Replay the pending invalidations now, at most every ``CATCH_UP_INTERVAL_S`` and only
        while the breaker is closed (otherwise its probe replays them before it closes); never
        raises. What this process had left unapplied before the replay began, and has no row
        left once it succeeds, is applied: by it, or by a replayer before it (a row is deleted
        only once applied)."""
        now = time.monotonic()
        if now < self._catch_up_after or self.breaker.state != CircuitBreaker.CLOSED:
            return
        self._catch_up_after = now + CATCH_UP_INTERVAL_S
        with self._unapplied_lock:
            before = dict(self._unapplied)
        try:
            self.replay_pending()
            # The replay skips the rows another replayer holds (SKIP LOCKED), and that one may
            # still fail and roll back: an item whose row is still there is not applied yet.
            applied = set(before) - self._still_pending(set(before))
        except REPLAY_ERRORS as exc:
            log.warning("deferred cache invalidations still not applied", alias=self.alias, error=str(exc))
            return
        with self._unapplied_lock:
            for item in applied:
                if self._unapplied.get(item) == before[item]:
                    del self._unapplied[item]

    def _still_pending(self, items: set[tuple[str, str]]) -> set[tuple[str, str]]:
        """Those of ``items`` that have a row on a database the replay reads; raises the
        database's error."""
        from composition.cache.models import PendingInvalidation  # late: needs the app registry

        if not items:
            return set()
        targets = {target for _, target in items}
        found: set[tuple[str, str]] = set()
        for db_alias in (self.db_alias, *self._other_databases()):
            rows = PendingInvalidation.objects.using(db_alias).filter(alias=self.alias, target__in=targets)
            found.update(rows.values_list("kind", "target").distinct())
        return found & items

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
