"""Retention: what old rows go, when, and who prunes them.

In small batches: the inbox ledger after ``INBOX_RETENTION_S``, but never while its message could
still be redelivered (``jobs.policy.redelivery_window_s``) or a dead letter with its key is unresolved or was
recently replayed, or its effects could run twice; sent outbox rows after ``OUTBOX_RETENTION_S``;
resolved dead letters after ``DEAD_LETTER_RETENTION_S``; schedule ticks whose run is over after
``SCHEDULE_TICK_RETENTION_S``; the queues' history buckets after ``QUEUE_HISTORY_RETENTION_S``;
finished ``django.tasks`` results after ``TASK_RESULT_RETENTION_S``.
``RetentionComponent`` prunes every ``RETENTION_INTERVAL_S`` in each worker process; a Redis lock
lets one prune at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any

import structlog
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections
from django.db.models import Exists, F, OuterRef, Q, QuerySet, TextField, Value
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce, NullIf
from django.utils import timezone

from composition.broker.configured import configured_broker
from composition.conf import conf
from composition.db.pruning import PruneResult, delete_in_batches
from composition.errors import described
from composition.jobs.models import DeadLetter, ProcessedMessage, TaskRecord
from composition.jobs.policy import JobPolicy, redelivery_window_s
from composition.lifecycle.periodic import PeriodicComponent
from composition.locks import LockBackendUnavailable, LockLost, LockNotAcquired, acquire_redis_lock
from composition.outbox.maintenance import sent_older_than
from composition.outbox.publish import IDEMPOTENCY_KEY_HEADER

__all__ = [
    "RetentionComponent",
    "dead_letters_older_than",
    "ledger_older_than",
    "ledger_retention_s",
    "longest_redelivery_window",
    "prune_dead_letters",
    "prune_expired",
    "pruning_lock_name",
    "queue_buckets_older_than",
    "task_results_older_than",
]

log = structlog.get_logger("composition.retention")

# The lock (namespace, key) that makes one process the pruner of the whole cluster, and its TTL,
# renewed before each batch: a pruner killed mid-round holds the others off this long at most.
LOCK_NAMESPACE = "composition.retention"
LOCK_KEY = "prune"
PRUNER_LOCK_TTL_S = 30.0


def longest_redelivery_window(actors: Iterable[Any] | None = None) -> tuple[str, float] | None:
    """(actor name, window in seconds) of the job with the longest ``redelivery_window_s`` among
    ``actors`` (default: every actor of the configured broker); None when none is a ``@job``.
    Plain Dramatiq actors carry no ``job_policy`` and are skipped."""
    if actors is None:
        actors = configured_broker().actors.values()
    heartbeat_timeout_s = float(conf.BROKER_HEARTBEAT_TIMEOUT_S)
    lease_s = float(conf.OUTBOX_LEASE_S)
    longest: tuple[str, float] | None = None
    for actor in actors:
        policy = actor.options.get("job_policy")
        if not isinstance(policy, JobPolicy):
            continue
        window_s = redelivery_window_s(policy, heartbeat_timeout_s=heartbeat_timeout_s, lease_s=lease_s)
        if longest is None or window_s > longest[1]:
            longest = (actor.actor_name, window_s)
    return longest


def ledger_retention_s() -> float | None:
    """How long ledger rows are kept: ``INBOX_RETENTION_S``, raised to the longest redelivery
    window of a declared job (system check W060 says when that happens); None keeps them forever."""
    setting = conf.INBOX_RETENTION_S
    if setting is None:
        return None
    longest = longest_redelivery_window()
    return max(float(setting), longest[1]) if longest else float(setting)


def _before(older_than_s: float) -> Any:
    return timezone.now() - timedelta(seconds=older_than_s)


def ledger_older_than(older_than_s: float) -> QuerySet[Any]:
    """Ledger rows written more than ``older_than_s`` seconds ago, except those under the key of
    a dead letter that is unresolved, or was replayed less than ``older_than_s`` ago: another
    copy of that message ran (a duplicate delivery), and the replay, however late, must still
    find its effects recorded (a replay may wait in the outbox, the queue or its own retries)."""
    cutoff = _before(older_than_s)
    dead_letter_key = Coalesce(NullIf(KT(f"headers__{IDEMPOTENCY_KEY_HEADER}"), Value("")), F("message_id"),
                               output_field=TextField())
    holding = DeadLetter.objects.filter(Q(status=DeadLetter.Status.DEAD)
                                        | Q(status=DeadLetter.Status.REPLAYED, replayed_at__gte=cutoff)).annotate(
        key=dead_letter_key).filter(key=OuterRef("message_id"))
    return ProcessedMessage.objects.filter(processed_at__lt=cutoff).exclude(Exists(holding))


def dead_letters_older_than(older_than_s: float) -> QuerySet[Any]:
    """Dead letters replayed or discarded more than ``older_than_s`` seconds ago; never an
    unresolved one, whatever its age, nor one replayed within the ledger's retention: it is what
    keeps its key's ledger row for the replay (``ledger_older_than``)."""
    cutoff = _before(older_than_s)
    ledger_s = ledger_retention_s()
    replayed_cutoff = cutoff if ledger_s is None else min(cutoff, _before(ledger_s))
    return DeadLetter.objects.filter(Q(status=DeadLetter.Status.REPLAYED, replayed_at__lt=replayed_cutoff)
                                     | Q(status=DeadLetter.Status.DISCARDED, discarded_at__lt=cutoff))


def schedule_ticks_older_than(older_than_s: float) -> QuerySet[Any]:
    """Fired ticks older than ``older_than_s`` seconds whose run ended, or whose lease did."""
    from composition.schedules.models import ScheduleTick

    return ScheduleTick.objects.filter(created_at__lt=_before(older_than_s)).filter(
        Q(finished_at__isnull=False) | Q(lease_until__lt=timezone.now()))


def queue_buckets_older_than(older_than_s: float) -> QuerySet[Any]:
    """The queues' history buckets that started more than ``older_than_s`` seconds ago."""
    from composition.queues.models import QueueBucket

    return QueueBucket.objects.filter(started_at__lt=_before(older_than_s))


def task_results_older_than(older_than_s: float) -> QuerySet[Any]:
    """Task results finished more than ``older_than_s`` seconds ago, except a failure whose dead
    letter is unresolved: its replay would carry on the same result."""
    unresolved = DeadLetter.objects.filter(status=DeadLetter.Status.DEAD, message_id=OuterRef("message_id"))
    return TaskRecord.objects.filter(finished_at__lt=_before(older_than_s)).exclude(
        Q(status=TaskRecord.Status.FAILED) & Exists(unresolved))


def _batch_size(batch_size: int | None) -> int:
    return int(conf.RETENTION_BATCH_SIZE) if batch_size is None else batch_size


def prune_dead_letters(older_than_s: float, *, batch_size: int | None = None, dry_run: bool = False) -> PruneResult:
    """Delete replayed or discarded dead letters resolved more than ``older_than_s`` seconds ago,
    ``batch_size`` (default ``RETENTION_BATCH_SIZE``) per transaction; a dry run only counts."""
    return delete_in_batches(dead_letters_older_than(older_than_s), batch_size=_batch_size(batch_size),
                             dry_run=dry_run)


def _expired() -> Iterator[tuple[str, QuerySet[Any]]]:
    """(name, rows past their retention) per table whose retention is set, built lazily so the
    cutoffs are taken when each table's turn comes."""
    ledger_s = ledger_retention_s()
    if ledger_s is not None:
        yield "inbox ledger", ledger_older_than(ledger_s)
    if conf.OUTBOX_RETENTION_S is not None:
        yield "sent outbox", sent_older_than(float(conf.OUTBOX_RETENTION_S))
    if conf.DEAD_LETTER_RETENTION_S is not None:
        yield "resolved dead letters", dead_letters_older_than(float(conf.DEAD_LETTER_RETENTION_S))
    if conf.SCHEDULE_TICK_RETENTION_S is not None:
        yield "schedule ticks", schedule_ticks_older_than(float(conf.SCHEDULE_TICK_RETENTION_S))
    if conf.QUEUE_HISTORY_RETENTION_S is not None:
        yield "queue history", queue_buckets_older_than(float(conf.QUEUE_HISTORY_RETENTION_S))
    if conf.TASK_RESULT_RETENTION_S is not None:
        yield "task results", task_results_older_than(float(conf.TASK_RESULT_RETENTION_S))


def pruning_lock_name(using: str = DEFAULT_DB_ALIAS) -> str:
    """The Redis lock one pruner of a database holds: keyed by the database's name too, so that
    another project's (another database's) pruner on the same Redis does not keep this one from
    pruning."""
    return f"{LOCK_NAMESPACE}:{LOCK_KEY}:{connections[using].settings_dict['NAME']}"


@contextmanager
def _sole_pruner(using: str = DEFAULT_DB_ALIAS) -> Iterator[Callable[[], None] | None]:
    """Yields ``renew()`` while this process is the database's pruner, None at once when another
    process is. The lock is a Redis lock with a TTL and an owner token, renewed before each batch
    (``renew`` raises ``LockLost`` once it is someone else's), not a PostgreSQL session lock:
    behind a transaction pooler that one would stay with a pooled server connection. With Redis
    unreachable it prunes anyway: pruners skip each other's locked rows, so two only share work.
    """
    try:
        lock = acquire_redis_lock(pruning_lock_name(using), ttl_s=PRUNER_LOCK_TTL_S)
    except LockBackendUnavailable as exc:
        log.warning("retention prunes without its one-pruner lock: Redis is unreachable", error=described(exc))
        yield lambda: None
        return
    except LockNotAcquired:
        yield None
        return
    unreachable: list[bool] = []

    def renew() -> None:
        if unreachable:
            return
        try:
            lock.extend(PRUNER_LOCK_TTL_S)
        except LockBackendUnavailable as exc:
            # Lost mid-round, as at its start: go on (the lock lapses at its TTL).
            log.warning("retention goes on without its one-pruner lock: Redis became unreachable",
                        error=described(exc))
            unreachable.append(True)

    try:
        yield renew
    finally:
        with suppress(LockBackendUnavailable):  # unreachable: the lock lapses at its TTL
            lock.release()


def prune_expired(*, batch_size: int | None = None,
                  should_stop: Callable[[], bool] | None = None) -> list[PruneResult] | None:
    """Prune every table past its retention; None when another process is pruning right now.

    A table whose prune fails is logged and left for the next round; the others still go.
    ``should_stop`` is asked between batches, so that a drain does not wait for a long prune.
    """
    size = _batch_size(batch_size)
    with _sole_pruner() as renew:
        if renew is None:
            return None
        lost: list[bool] = []

        def stop() -> bool:
            # Asked before each batch: renews the lock, and stops once it is lost or a drain began.
            if lost or (should_stop is not None and should_stop()):
                return True
            try:
                renew()
            except LockLost:
                log.warning("retention stopped: its one-pruner lock expired under it")
                lost.append(True)
                return True
            return False

        results: list[PruneResult] = []
        for name, rows in _expired():
            if stop():
                break
            try:
                results.append(delete_in_batches(rows, batch_size=size, should_stop=stop))
            except Exception as exc:  # one table's trouble must not starve the others
                log.warning("retention prune failed", table=name, error=described(exc))
        return results


class RetentionComponent(PeriodicComponent):
    """Runs ``prune_expired`` at start and then every ``interval_s`` (default
    ``RETENTION_INTERVAL_S``) on a background thread that holds one database connection."""

    name = "retention"
    depends_on = ("database",)
    interval_setting = "RETENTION_INTERVAL_S"
    failure_event = "retention round failed"
    logger = log

    def __init__(self, *, interval_s: float | None = None, batch_size: int | None = None) -> None:
        super().__init__(interval_s=interval_s)
        self._batch_size = batch_size

    def run_once(self) -> list[PruneResult] | None:
        """One round (see ``prune_expired``)."""
        close_old_connections()
        return prune_expired(batch_size=self._batch_size, should_stop=self.stopping)

    def tick(self) -> None:
        for result in self.run_once() or ():
            if result.deleted:
                log.info("retention pruned rows", table=result.table, count=result.deleted,
                         batches=result.batches)
