"""Invalidation that is never lost: after commit when Redis answers, else through PostgreSQL.

- ``schedule`` runs the invalidation after the writer's transaction commits (``on_commit``); when
  the breaker is already open it writes a PendingInvalidation row *inside* that transaction, so
  the deferred invalidation commits, or rolls back, with the data it is about;
- ``apply_now`` deletes the entry and its rebuild lease (or bumps the namespace version); if
  Redis cannot be reached it writes the row (autocommit, right after the failed attempt);
- ``replay_pending`` applies and deletes the rows. The breaker's probe runs it before closing,
  and InvalidationReplayComponent runs it periodically for everyone else.
"""

from __future__ import annotations

from typing import Any

import redis
import structlog
from django.db import DatabaseError, connections, transaction

from composition.cache._breaker import _Breaker
from composition.metrics import CACHE_INVALIDATIONS

__all__ = ["REDIS_ERRORS", "Invalidations", "KeySpace"]

log = structlog.get_logger("composition.cache")

REDIS_ERRORS: tuple[type[BaseException], ...] = (redis.exceptions.RedisError, OSError)

KIND_KEY = "key"
KIND_NAMESPACE = "namespace"


class KeySpace:
    """Redis key names of cache_aside: entry, rebuild lease and namespace version."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def entry(self, key: str) -> str:
        return f"{self.prefix}e:{key}"

    def lease(self, key: str) -> str:
        return f"{self.prefix}l:{key}"

    def namespace(self, namespace: str) -> str:
        return f"{self.prefix}n:{namespace}"


class Invalidations:
    """Invalidations of one cache alias (see the module docstring)."""

    def __init__(self, alias: str, client: Any, keys: KeySpace, breaker: _Breaker, *, db_alias: str) -> None:
        self.alias = alias
        self.client = client
        self.keys = keys
        self.breaker = breaker
        self.db_alias = db_alias

    def schedule(self, kind: str, target: str, *, using: str | None = None) -> None:
        """Invalidate after the transaction on ``using`` commits (at once outside one); nothing
        happens if it rolls back."""
        db_alias = using or self.db_alias
        if self.breaker.is_open and connections[db_alias].in_atomic_block:
            # Redis is known to be down: record it in the writer's transaction.
            self._defer(kind, target, db_alias)
            return
        transaction.on_commit(lambda: self.apply_now(kind, target, db_alias), using=db_alias)

    def apply_now(self, kind: str, target: str, db_alias: str | None = None) -> None:
        """Apply an invalidation in Redis now, or record it in PostgreSQL if Redis is unreachable.
        Never raises for a Redis outage; logs (and counts as lost) when the database fails too."""
        if self.breaker.allow():
            try:
                self._apply(self.client, kind, target)
            except REDIS_ERRORS as exc:
                self.breaker.failure()
                log.warning("cache invalidation could not reach redis", alias=self.alias, error=str(exc))
            else:
                self.breaker.success()
                CACHE_INVALIDATIONS.labels("applied").inc()
                return
        self._defer(kind, target, db_alias or self.db_alias)

    def _apply(self, client: Any, kind: str, target: str) -> None:
        if kind == KIND_NAMESPACE:
            client.incr(self.keys.namespace(target))
        else:
            # The lease goes too: a reader that loaded before this write may no longer fill.
            client.delete(self.keys.entry(target), self.keys.lease(target))

    def _defer(self, kind: str, target: str, db_alias: str) -> None:
        from composition.cache.models import PendingInvalidation

        try:
            PendingInvalidation.objects.using(db_alias).create(alias=self.alias, kind=kind, target=target)
        except DatabaseError as exc:
            CACHE_INVALIDATIONS.labels("lost").inc()
            log.error("cache invalidation lost: redis and the database both failed", alias=self.alias,
                      kind=kind, target=target, error=str(exc))
            if connections[db_alias].in_atomic_block:
                raise  # the writer's transaction is broken anyway; let it roll back
            return
        CACHE_INVALIDATIONS.labels("deferred").inc()
        log.warning("cache invalidation deferred until redis is back", alias=self.alias, kind=kind,
                    target=target)

    def replay_pending(self, *, batch: int = 500) -> int:
        """Apply every deferred invalidation of this alias, oldest first, then delete its rows;
        returns how many.

        Replaying twice is harmless (a delete is idempotent, a namespace bump only costs misses),
        so concurrent replayers need no lock. Raises the Redis or database error that stopped it;
        the remaining rows stay for the next attempt.
        """
        from composition.cache.models import PendingInvalidation

        rows = PendingInvalidation.objects.using(self.db_alias).filter(alias=self.alias)
        total = 0
        while True:
            batch_rows = list(rows.order_by("id").values_list("id", "kind", "target")[:batch])
            if not batch_rows:
                return total
            pipe = self.client.pipeline(transaction=False)
            for _, kind, target in batch_rows:
                self._apply(pipe, kind, target)
            pipe.execute()
            rows.filter(id__in=[row[0] for row in batch_rows]).delete()
            total += len(batch_rows)
            CACHE_INVALIDATIONS.labels("replayed").inc(len(batch_rows))
