"""Invalidation that is never lost: durable at COMMIT, applied right after it, replayed if not.

``schedule`` inside a transaction writes a ``PendingInvalidation`` row in the writer's transaction;
one after-commit hook applies the transaction's invalidations in one Redis pipeline and deletes
their rows. Rows left behind (a crash, Redis down, an open breaker) are applied by
``replay_pending`` (``FOR UPDATE SKIP LOCKED``). Outside a transaction ``apply_now`` deletes at
once. Applying an invalidation twice is harmless, so writer and replayer need no coordination.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import structlog
from django.db import DatabaseError, connections, transaction
from django.utils import timezone

from composition.breaker import CircuitBreaker
from composition.cache.pending_replay import REPLAY_ERRORS, ReplaysPending
from composition.cache.results import namespace_of
from composition.cache.store import KeySpace
from composition.db.transactions import on_commit_once, open_savepoints, queued_once, savepoint_outside_atomic
from composition.errors import REDIS_ERRORS
from composition.metrics import CACHE_INVALIDATIONS

__all__ = ["KIND_KEY", "KIND_NAMESPACE", "Invalidations"]

log = structlog.get_logger("composition.cache")


KIND_KEY = "key"
KIND_NAMESPACE = "namespace"

# A condition that is always true and turns synchronous_commit off for the statement's own
# implicit transaction (set_config(..., true) lasts until that transaction ends).
_RELAXED_COMMIT = " AND set_config('synchronous_commit', 'off', true) IS NOT NULL"


class TransactionInvalidations:
    """The invalidations one transaction recorded for one cache alias on one database: applied
    together by one hook after that transaction commits (the hook is the object itself).

    ``targets`` maps (kind, target) to the savepoints that were open when its row was inserted,
    ``rows`` to that row's id; ``row_ids`` are every row this transaction inserted.
    """

    def __init__(self, invalidations: Invalidations, db_alias: str) -> None:
        self.invalidations = invalidations
        self.db_alias = db_alias
        self.targets: dict[tuple[str, str], frozenset[str | None]] = {}
        self.rows: dict[tuple[str, str], int] = {}  # (kind, target) -> the id of its latest row
        self.row_ids: list[int] = []

    def __call__(self) -> None:
        self.invalidations.apply_committed(self)

    def recorded(self, item: tuple[str, str], savepoints: frozenset[str | None]) -> bool:
        """True when ``item``'s row is certain to commit if the current context commits: it was
        inserted under ``savepoints`` that are all still open. A row inserted in a savepoint that has
        since been released or rolled back is not trusted (the two cannot be told apart), so the
        caller inserts again; a duplicate row costs one INSERT, a missing one would lose it."""
        sids = self.targets.get(item)
        return sids is not None and sids.issubset(savepoints)


class Invalidations(ReplaysPending):
    """Invalidations of one cache alias (see the module docstring)."""

    def __init__(self, alias: str, client: Any, keys: KeySpace, breaker: CircuitBreaker, *, db_alias: str,
                 on_applied: Callable[[str, str], None] | None = None) -> None:
        self.alias = alias
        self.client = client
        self.keys = keys
        self.breaker = breaker
        self.db_alias = db_alias
        # Told (kind, target) of every invalidation applied in Redis by this process.
        self.on_applied = on_applied
        self._replayed_databases: list[str] | None = None
        # What this process could not apply right after COMMIT: its reads of those keys go to the
        # database (storing nothing) until a replay applies them, which such a read tries first
        # (at most every CATCH_UP_INTERVAL_S). Its own write is never served stale to it.
        # Each unapplied item with how often it was left for replay: a catch-up clears only
        # those not left again while it ran (their newer row may be the one it did not see).
        self._unapplied: dict[tuple[str, str], int] = {}
        self._unapplied_lock = threading.Lock()
        self._catch_up_after = 0.0
        # By thread ident, the databases on which that thread queued a batch and may not have
        # ended the transaction yet (a connection belongs to one thread): the other threads,
        # nearly every read, skip the look at their connections.
        self._batch_databases: dict[int, set[str]] = {}

    def schedule(self, kind: str, target: str, *, using: str | None = None) -> None:
        """Invalidate after the transaction on ``using`` commits (at once outside one); nothing
        happens if it rolls back. Inside a transaction the invalidation is recorded in it; the
        database error of that INSERT propagates (the writer's transaction is broken anyway)."""
        db_alias = using or self.db_alias
        connection = connections[db_alias]
        if not connection.in_atomic_block:
            # Autocommit: apply now (on_commit runs it at once; it still refuses manual
            # transaction management, as before).
            transaction.on_commit(lambda: self.apply_now(kind, target, db_alias), using=db_alias)
            return
        # The transaction's batch, or a new one when this is its first invalidation here or the
        # savepoint that registered the previous batch rolled back (taking every row of that
        # batch with it, since they were all inserted inside it). Keyed by this object, so an
        # engine rebuilt mid-transaction (new settings) starts its own batch.
        batch = on_commit_once(self, TransactionInvalidations(self, db_alias), using=db_alias, robust=True)
        self._batch_databases.setdefault(threading.get_ident(), set()).add(db_alias)
        item = (kind, target)
        savepoints = open_savepoints(db_alias)
        # A savepoint atomic does not know of (transaction.savepoint()) may have taken the row
        # back: once one may have, the row is looked for (a missing one would lose the
        # invalidation when Redis fails at COMMIT).
        if batch.recorded(item, savepoints) and (not savepoint_outside_atomic(db_alias)
                                                 or self._still_there(batch.rows[item], db_alias)):
            return
        self._insert_pending_row(kind, target, db_alias, batch.row_ids.append)
        batch.targets[item] = savepoints
        batch.rows[item] = batch.row_ids[-1]

    def invalidated_in_transaction(self, key: str) -> bool:
        """Whether a transaction this thread has open, on any database, invalidated ``key`` (or
        its namespace) and has not committed yet."""
        databases = self._batch_databases.get(threading.get_ident()) if self._batch_databases else None
        if not databases:
            return False
        items = ((KIND_KEY, key), (KIND_NAMESPACE, namespace_of(key)))
        for db_alias in list(databases):
            batch = queued_once(self, using=db_alias)
            if batch is None:  # committed or rolled back since
                databases.discard(db_alias)
            elif any(item in batch.targets for item in items):
                return True
        if not databases:
            self._batch_databases.pop(threading.get_ident(), None)
        return False

    @staticmethod
    def _still_there(row_id: int, db_alias: str) -> bool:
        from composition.cache.models import PendingInvalidation

        connection = connections[db_alias]
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT 1 FROM {connection.ops.quote_name(PendingInvalidation._meta.db_table)} "
                           "WHERE id = %s", [row_id])
            return cursor.fetchone() is not None

    def _insert_pending_row(self, kind: str, target: str, db_alias: str, on_id: Callable[[int], None]) -> None:
        """Record the invalidation as a PendingInvalidation row; ``on_id`` gets its id."""
        # Late: models need the app registry, and composition.cache is importable before it.
        from composition.cache.models import PendingInvalidation

        # One plain INSERT rather than Model.objects.create(): every invalidating write runs it,
        # and the ORM's model and compiler work cost more than the statement itself.
        connection = connections[db_alias]
        table = connection.ops.quote_name(PendingInvalidation._meta.db_table)
        sql = f"INSERT INTO {table} (alias, kind, target, created_at) VALUES (%s, %s, %s, %s) RETURNING id"
        values: list[Any] = [self.alias, kind, target, timezone.now()]
        with connection.cursor() as cursor:
            cursor.execute(sql, values)
            on_id(int(cursor.fetchone()[0]))

    def apply_committed(self, batch: TransactionInvalidations) -> None:
        """After COMMIT: apply a transaction's invalidations in one Redis round trip (a pipeline
        when there are several), then delete their rows. Never raises: when Redis is unreachable
        (or the breaker open) the rows stay for the replay; when the DELETE fails they stay too,
        and replaying them is harmless."""
        count = len(batch.targets)
        if not count:
            return  # the only INSERT failed; there is nothing to apply
        if not self.breaker.allow():
            self._left_for_replay(batch.targets, "circuit open")
            return
        try:
            if count == 1:  # the usual case: one command, no pipeline to build
                self._apply(self.client, *next(iter(batch.targets)))
            else:
                pipe = self.client.pipeline(transaction=False)
                for kind, target in batch.targets:
                    self._apply(pipe, kind, target)
                pipe.execute()
        except REDIS_ERRORS as exc:
            self.breaker.record_failure()
            self._left_for_replay(batch.targets, str(exc))
            return
        self.breaker.record_success()
        CACHE_INVALIDATIONS.labels("applied").inc(count)
        self._applied(batch.targets)
        try:
            self._forget(batch.row_ids, batch.db_alias)
        except DatabaseError as exc:  # a row left behind is replayed, harmlessly
            log.warning("applied cache invalidations stay recorded; the replay repeats them",
                        alias=self.alias, count=len(batch.row_ids), error=str(exc))

    def _applied(self, items: Iterable[tuple[str, str]]) -> None:
        items = list(items)
        if self._unapplied:
            with self._unapplied_lock:
                for item in items:
                    self._unapplied.pop(item, None)
        if self.on_applied is not None:
            for kind, target in items:
                self.on_applied(kind, target)

    def _left_for_replay(self, items: Iterable[tuple[str, str]], reason: str) -> None:
        items = list(items)
        with self._unapplied_lock:
            for item in items:
                self._unapplied[item] = self._unapplied.get(item, 0) + 1
        CACHE_INVALIDATIONS.labels("deferred").inc(len(items))
        log.warning("cache invalidation deferred until redis is back", alias=self.alias, count=len(items),
                    reason=reason)

    def unapplied(self, key: str) -> bool:
        """Whether this process recorded an invalidation of ``key`` (or its namespace) that it
        could not apply and no replay has applied since."""
        if not self._unapplied:  # the usual case, on every read: one look
            return False
        return (KIND_KEY, key) in self._unapplied or (KIND_NAMESPACE, namespace_of(key)) in self._unapplied

    def _forget(self, row_ids: list[int], db_alias: str) -> None:
        """Delete applied rows, skipping any a replayer holds (it is applying them, and deletes
        them itself), so the writer never waits for a replayer.

        Outside a transaction (right after COMMIT, the usual case) the DELETE's own commit does
        not wait for the WAL flush: should a server crash lose it, the rows come back and the
        replay applies them again, which is harmless. Waiting for that flush was most of what
        this bookkeeping cost a request."""
        from composition.cache.models import PendingInvalidation  # late: needs the app registry

        connection = connections[db_alias]
        table = connection.ops.quote_name(PendingInvalidation._meta.db_table)
        relax = "" if connection.in_atomic_block else _RELAXED_COMMIT
        with connection.cursor() as cursor:
            # The ids as an array literal: binding text is cheaper than adapting a list.
            cursor.execute(f"DELETE FROM {table} WHERE id IN "
                           f"(SELECT id FROM {table} WHERE id = ANY(%s::bigint[]){relax} FOR UPDATE SKIP LOCKED)",
                           ["{" + ",".join(str(int(pk)) for pk in row_ids) + "}"])

    def apply_now(self, kind: str, target: str, db_alias: str | None = None) -> None:
        """Apply an invalidation in Redis now, or record it in PostgreSQL if Redis is unreachable.
        Never raises for a Redis outage; logs (and counts as lost) when the database fails too."""
        if self.breaker.allow():
            try:
                self._apply(self.client, kind, target)
            except REDIS_ERRORS as exc:
                self.breaker.record_failure()
                log.warning("cache invalidation could not reach redis", alias=self.alias, error=str(exc))
            else:
                self.breaker.record_success()
                CACHE_INVALIDATIONS.labels("applied").inc()
                self._applied([(kind, target)])
                return
            self._defer(kind, target, db_alias or self.db_alias)
            return
        self._defer(kind, target, db_alias or self.db_alias)
        if self.breaker.state == CircuitBreaker.CLOSED:
            # Refused while the breaker's probe ran, and recorded after the probe's last replay
            # (the probe has closed it since): applied now, not at the next periodic replay.
            try:
                self.replay_pending()
            except REPLAY_ERRORS as exc:
                log.warning("deferred cache invalidation left for the replay", alias=self.alias, error=str(exc))

    def _apply(self, client: Any, kind: str, target: str) -> None:
        if kind == KIND_NAMESPACE:
            client.incr(self.keys.namespace(target))
        else:
            # The lease goes too: a reader that loaded before this write may no longer fill.
            client.delete(self.keys.entry(target), self.keys.lease(target))

    def _defer(self, kind: str, target: str, db_alias: str) -> None:
        try:
            self._insert_pending_row(kind, target, db_alias, on_id=lambda _: None)
        except DatabaseError as exc:
            CACHE_INVALIDATIONS.labels("lost").inc()
            log.error("cache invalidation lost: redis and the database both failed", alias=self.alias,
                      kind=kind, target=target, error=str(exc))
            return
        self._left_for_replay([(kind, target)], "redis unreachable")
