"""Retention: old rows go in small batches, nothing still needed goes, and runworkers does it."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from composition.checks import check_retention_settings
from composition.conf import conf
from composition.db.pruning import delete_in_batches
from composition.jobs import job
from composition.jobs.models import DeadLetter, ProcessedMessage, TaskRecord
from composition.jobs.policy import JobPolicy, redelivery_window_s
from composition.locks import acquire_redis_lock
from composition.outbox.models import OutboxMessage
from composition.queues.history import record_buckets
from composition.queues.models import QueueBucket
from composition.retention import (
    ledger_older_than,
    longest_redelivery_window,
    prune_expired,
    pruning_lock_name,
)
from composition.testing import metric_value, use_broker, wait_until
from tests.jobsapp import jobs

DAY_S = 86_400.0


@pytest.fixture(autouse=True)
def _no_pruner_lock_left() -> None:
    """A worker an earlier test SIGKILLed while it pruned (every worker prunes as it starts) holds
    the pruner lock for its TTL: these tests start from a cluster without one."""
    _pruner_lock_key_deleted()


def _pruner_lock_key_deleted() -> int:
    from django.core.cache import caches

    cache: Any = caches[conf.CACHE_ALIAS]
    return int(cache.client.get_client(write=True).delete(cache.make_key(f"composition:lock:{pruning_lock_name()}")))


def _ago(seconds: float) -> Any:
    return timezone.now() - timedelta(seconds=seconds)


def ledger_rows(age_s: float, n: int, prefix: str) -> list[int]:
    rows = ProcessedMessage.objects.bulk_create(
        [ProcessedMessage(message_id=f"{prefix}-{i}", actor="charge", processed_at=_ago(age_s)) for i in range(n)])
    return [row.pk for row in rows]


def task_result(finished_s: float | None, status: str, *, dead_letter_status: str | None = None) -> Any:
    record = TaskRecord.objects.create(backend="default", queue_name="q", task_path="m.f", status=status,
                                       finished_at=None if finished_s is None else _ago(finished_s),
                                       message_id=f"task-{TaskRecord.objects.count()}")
    if dead_letter_status is not None:
        DeadLetter.objects.filter(pk=dead_letter(DAY_S, dead_letter_status, "task")).update(
            message_id=record.message_id)
    return record.pk


def outbox_rows(age_s: float, n: int, *, status: str = "sent") -> list[int]:
    when = _ago(age_s)
    rows = OutboxMessage.objects.bulk_create([
        OutboxMessage(actor_name="retention_probe", queue_name="retention_probe", payload={"seq": i},
                      status=status, created_at=when, sent_at=when if status == "sent" else None)
        for i in range(n)])
    return [row.pk for row in rows]


def dead_letter(age_s: float, status: str, prefix: str) -> int:
    when = _ago(age_s)
    row = DeadLetter.objects.create(
        actor="charge", queue="jobs_check", message_id=f"{prefix}-{status}-{age_s}", attempts=1,
        error_class="PermanentError", fingerprint="f" * 64, first_failed_at=when, last_failed_at=when,
        status=status, replayed_at=when if status == "replayed" else None,
        discarded_at=when if status == "discarded" else None, created_at=when)
    return int(row.pk)


def _pruned(table: str) -> float:
    return metric_value("composition_retention_pruned_total", table=table)


# -- batches ---------------------------------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize(("old", "batch_size", "statements"), [(7, 3, 3), (2, 5, 1), (10, 1, 11)])
def test_prune_deletes_in_batches_of_the_given_size(old: int, batch_size: int, statements: int) -> None:
    old_ids = ledger_rows(2 * DAY_S, old, "old")
    young_ids = ledger_rows(60, 2, "young")
    before = _pruned("composition_processedmessage")
    with CaptureQueriesContext(connection) as queries:
        result = delete_in_batches(ledger_older_than(DAY_S), batch_size=batch_size)
    deletes = [query["sql"] for query in queries if query["sql"].startswith("DELETE")]
    # ceil(N/b) batches, plus one empty statement to see the end when b divides N.
    assert statements == math.ceil(old / batch_size) + (old % batch_size == 0)
    assert (result.deleted, result.batches, len(deletes)) == (old, statements, statements)
    assert all("FOR UPDATE SKIP LOCKED" in sql and f"LIMIT {batch_size}" in sql for sql in deletes)
    assert set(ProcessedMessage.objects.values_list("pk", flat=True)) == set(young_ids)
    assert not set(old_ids) & set(ProcessedMessage.objects.values_list("pk", flat=True))
    assert _pruned("composition_processedmessage") - before == old


@pytest.mark.django_db
def test_a_dry_run_counts_and_a_stop_request_ends_the_prune_between_batches() -> None:
    ledger_rows(2 * DAY_S, 5, "old")
    dry = delete_in_batches(ledger_older_than(DAY_S), batch_size=2, dry_run=True)
    assert (dry.deleted, dry.batches, ProcessedMessage.objects.count()) == (5, 0, 5)
    asked = iter([False, True])
    result = delete_in_batches(ledger_older_than(DAY_S), batch_size=2, should_stop=lambda: next(asked))
    assert (result.deleted, result.batches, ProcessedMessage.objects.count()) == (2, 1, 3)


# -- what goes and what stays ----------------------------------------------------------------------------
def test_the_redelivery_window_is_the_whole_retry_schedule_plus_heartbeat_and_lease() -> None:
    # Defaults: delays 15 + 30 + 60 + 120 (10 s doubling, +50 % jitter), five 120 s attempts.
    assert redelivery_window_s(JobPolicy(), heartbeat_timeout_s=15, lease_s=30) == 225 + 600 + 15 + 30
    # Capped: min(20, 15), then 20, 20.
    capped = JobPolicy(max_attempts=4, initial_delay_s=10, max_delay_s=20, timeout_s=1)
    assert redelivery_window_s(capped, heartbeat_timeout_s=1, lease_s=2) == 55 + 4 + 1 + 2


@pytest.mark.django_db
def test_ledger_rows_inside_the_redelivery_window_stay_whatever_the_setting() -> None:
    longest = longest_redelivery_window()
    assert longest is not None
    window_s = longest[1]
    with override_settings(COMPOSITION={**settings.COMPOSITION, "INBOX_RETENTION_S": 60.0}):
        fresh = ledger_rows(30, 2, "fresh")
        inside = ledger_rows(window_s - 120, 3, "inside")
        outside = ledger_rows(window_s + 120, 4, "outside")
        results = prune_expired(batch_size=2)
    assert results is not None
    assert set(ProcessedMessage.objects.values_list("pk", flat=True)) == {*fresh, *inside}
    assert not set(outside) & set(ProcessedMessage.objects.values_list("pk", flat=True))


@pytest.mark.django_db
def test_defaults_prune_old_rows_of_each_table_and_keep_the_rest() -> None:
    keep_ledger = ledger_rows(6 * DAY_S, 2, "young")
    ledger_rows(8 * DAY_S, 3, "old")
    keep_outbox = outbox_rows(6 * DAY_S, 2) + outbox_rows(400 * DAY_S, 2, status="pending")
    outbox_rows(8 * DAY_S, 3)
    keep_letters = {dead_letter(400 * DAY_S, "dead", "unresolved"), dead_letter(29 * DAY_S, "replayed", "young"),
                    dead_letter(29 * DAY_S, "discarded", "young")}
    dead_letter(31 * DAY_S, "replayed", "old")
    dead_letter(31 * DAY_S, "discarded", "old")
    for age_s in (2 * DAY_S, 3600):  # the queues' history: a day's worth is kept
        record_buckets({"retained": 1}, {}, now_s=time.time() - age_s)
    # Task results: finished ones go after 7 days, except a failure whose dead letter is unresolved.
    keep_results = {task_result(6 * DAY_S, "SUCCESSFUL"), task_result(None, "READY"), task_result(None, "RUNNING"),
                    task_result(8 * DAY_S, "FAILED", dead_letter_status="dead")}
    for status in ("SUCCESSFUL", "FAILED"):
        task_result(8 * DAY_S, status)
    task_result(8 * DAY_S, "FAILED", dead_letter_status="replayed")
    keep_letters |= set(DeadLetter.objects.filter(message_id__startswith="task-").values_list("pk", flat=True))

    results = prune_expired(batch_size=2)

    assert results is not None
    assert {result.table: result.deleted for result in results} == {
        "composition_processedmessage": 3, "composition_outboxmessage": 3, "composition_deadletter": 2,
        "composition_scheduletick": 0, "composition_queuebucket": 1, "composition_taskrecord": 3}
    assert set(TaskRecord.objects.values_list("pk", flat=True)) == keep_results
    assert QueueBucket.objects.filter(queue="retained").count() == 1
    assert set(ProcessedMessage.objects.values_list("pk", flat=True)) == set(keep_ledger)
    assert set(OutboxMessage.objects.values_list("pk", flat=True)) == set(keep_outbox)
    assert set(DeadLetter.objects.values_list("pk", flat=True)) == keep_letters


@pytest.mark.django_db
def test_ledger_rows_of_an_unresolved_or_just_replayed_dead_letter_stay() -> None:
    # One copy of a message died, a duplicate of it ran: a replay, however late, must find
    # the effects recorded under the same key (the message id, or the idempotency key it carried).
    old = ledger_rows(400 * DAY_S, 4, "dup")
    by_id = dead_letter(1 * DAY_S, "dead", "by-id")
    DeadLetter.objects.filter(pk=by_id).update(message_id="dup-0")
    by_key = dead_letter(1 * DAY_S, "dead", "by-key")
    DeadLetter.objects.filter(pk=by_key).update(headers={"idempotency_key": "dup-1"})
    empty_key = dead_letter(1 * DAY_S, "dead", "empty-key")
    DeadLetter.objects.filter(pk=empty_key).update(message_id="dup-2", headers={"idempotency_key": ""})
    DeadLetter.objects.create(actor="charge", queue="jobs_check", message_id="dup-3", attempts=1,
                              error_class="PermanentError", fingerprint="f" * 64, first_failed_at=_ago(DAY_S),
                              last_failed_at=_ago(DAY_S), status="discarded", discarded_at=_ago(DAY_S))

    prune_expired(batch_size=2)
    assert set(ProcessedMessage.objects.values_list("pk", flat=True)) == set(old[:3])

    # Replayed just now: the replay has yet to run, and must find the effects recorded.
    DeadLetter.objects.filter(pk=by_id).update(status="replayed", replayed_at=timezone.now())
    DeadLetter.objects.filter(pk__in=[by_key, empty_key]).update(status="discarded", discarded_at=timezone.now())
    prune_expired(batch_size=2)
    assert set(ProcessedMessage.objects.values_list("pk", flat=True)) == {old[0]}
    # Replayed longer ago than the ledger keeps rows: that replay has long run.
    DeadLetter.objects.filter(pk=by_id).update(replayed_at=_ago(8 * DAY_S))
    prune_expired(batch_size=2)
    assert not ProcessedMessage.objects.exists()


@pytest.mark.django_db
def test_none_keeps_a_table_forever() -> None:
    ledger_rows(1000 * DAY_S, 2, "ancient")
    outbox_rows(1000 * DAY_S, 2)
    with override_settings(COMPOSITION={**settings.COMPOSITION, "INBOX_RETENTION_S": None,
                                        "OUTBOX_RETENTION_S": None, "SCHEDULE_TICK_RETENTION_S": None,
                                        "QUEUE_HISTORY_RETENTION_S": None, "TASK_RESULT_RETENTION_S": None}):
        results = prune_expired()
    assert results is not None and [result.table for result in results] == ["composition_deadletter"]
    assert (ProcessedMessage.objects.count(), OutboxMessage.objects.count()) == (2, 2)


@pytest.mark.django_db
def test_only_one_process_prunes_at_a_time() -> None:
    ledger_rows(8 * DAY_S, 2, "old")
    other = acquire_redis_lock(pruning_lock_name(), ttl_s=30)  # another process's, by its token
    try:
        assert prune_expired() is None
        assert ProcessedMessage.objects.count() == 2
    finally:
        other.release()
    # A killed holder's lock, left to its TTL, is what the fixture above deletes.
    killed = acquire_redis_lock(pruning_lock_name(), ttl_s=30)
    assert prune_expired() is None and _pruner_lock_key_deleted() == 1 and not killed.release()
    with connection.cursor() as cursor:  # and no session state left: no advisory lock held
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
        assert cursor.fetchone()[0] == 0
    assert prune_expired() is not None
    assert ProcessedMessage.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_redis_lost_in_the_middle_of_a_round_does_not_stop_it(throwaway_redis_server: Any) -> None:
    # The docs: with Redis unreachable each process prunes anyway. At the start of a round it did;
    # lost between two batches, the lock's renewal raised out of the round and nothing more went.
    ids = {dead_letter(40 * DAY_S, "discarded", f"lost-{index}") for index in range(3)}
    asked = 0

    def stop_redis_after_the_first_batch() -> bool:
        nonlocal asked
        asked += 1
        if asked == 3:  # before the table, before its first batch, then before the second
            throwaway_redis_server.stop()
        return False

    caches = {"default": {**settings.CACHES["default"], "LOCATION": throwaway_redis_server.url}}
    with override_settings(CACHES=caches, COMPOSITION=conf.as_dict()):
        results = prune_expired(batch_size=1, should_stop=stop_redis_after_the_first_batch)
    assert results is not None and asked >= 3
    assert not DeadLetter.objects.filter(pk__in=ids).exists()


# -- the system check -----------------------------------------------------------------------------------
def _retention_ids(**composition: object) -> list[str]:
    with override_settings(COMPOSITION={**settings.COMPOSITION, **composition}):
        return [str(message.id) for message in check_retention_settings()]


def test_settings_are_validated() -> None:
    assert check_retention_settings() == []
    assert _retention_ids(RETENTION_INTERVAL_S=0) == ["composition.E060"]
    assert _retention_ids(OUTBOX_RETENTION_S="7d") == ["composition.E060"]
    # "Forever" is None: inf, nan and 1e11 s passed, then every round raised OverflowError.
    for forever in (float("inf"), float("nan"), 1e11):
        assert _retention_ids(DEAD_LETTER_RETENTION_S=forever) == ["composition.E060"], forever
    assert _retention_ids(DEAD_LETTER_RETENTION_S=999 * 365 * 86_400) == []
    assert _retention_ids(RETENTION_BATCH_SIZE=0.5) == ["composition.E061"]
    assert _retention_ids(DEAD_LETTER_RETENTION_S=None, INBOX_RETENTION_S=None) == []


def test_the_check_warns_when_the_ledger_is_kept_shorter_than_a_job_can_come_back() -> None:
    with use_broker(str(conf.BROKER_URL)):
        @job(queue="retention_check", max_attempts=3, initial_delay_s=100, max_delay_s=150, timeout_s=1000,
             actor_name="retention_long_job")
        def long_job() -> None: ...

        @job(queue="retention_check", actor_name="retention_short_job")
        def short_job() -> None: ...

        # 100*1.5 + min(150, 300) + 3 * 1000 + the broker's heartbeat timeout + the outbox lease
        window_s = round(150 + 150 + 3000 + conf.BROKER_HEARTBEAT_TIMEOUT_S + conf.OUTBOX_LEASE_S)
        assert longest_redelivery_window() == ("retention_long_job", window_s)
        with override_settings(COMPOSITION={**settings.COMPOSITION, "INBOX_RETENTION_S": window_s - 1}):
            (message,) = check_retention_settings()
        assert message.id == "composition.W060"
        assert "'retention_long_job'" in message.msg and f"at least {window_s}" in str(message.hint)
        assert _retention_ids(INBOX_RETENTION_S=window_s) == []
        assert _retention_ids() == []


# -- commands ---------------------------------------------------------------------------------------------
def _deadletters(*args: str) -> str:
    out = StringIO()
    call_command("deadletters", "prune", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_a_replayed_dead_letter_stays_while_it_holds_a_ledger_row_the_ledger_would_keep() -> None:
    # The letter is what keeps a duplicate's ledger row for its replay, however late it runs:
    # pruned first (by hand, or by a DEAD_LETTER_RETENTION_S shorter than the ledger's), it let
    # the row go, and the replay ran the effects a second time.
    [held] = ledger_rows(400 * DAY_S, 1, "late")
    letter = dead_letter(2 * DAY_S, "replayed", "late")
    DeadLetter.objects.filter(pk=letter).update(message_id="late-0")
    assert json.loads(_deadletters("--older-than", "1", "--json")) == {"deleted": 0, "older_than_days": 1.0}
    with override_settings(COMPOSITION={**settings.COMPOSITION, "DEAD_LETTER_RETENTION_S": DAY_S}):
        prune_expired(batch_size=2)
    assert DeadLetter.objects.filter(pk=letter).exists() and ProcessedMessage.objects.filter(pk=held).exists()
    DeadLetter.objects.filter(pk=letter).update(replayed_at=_ago(8 * DAY_S))  # past the ledger's 7 days
    assert json.loads(_deadletters("--older-than", "1", "--json")) == {"deleted": 1, "older_than_days": 1.0}


@pytest.mark.django_db
def test_deadletters_prune_by_hand() -> None:
    keep = {dead_letter(400 * DAY_S, "dead", "unresolved"), dead_letter(2 * DAY_S, "discarded", "young")}
    for n in range(3):
        dead_letter(40 * DAY_S + n, "replayed", "old")
    assert "3 replayed or discarded dead letter(s) older than 30 days would be pruned (dry run)" in \
        _deadletters("--dry-run")
    assert DeadLetter.objects.count() == 5
    assert json.loads(_deadletters("--older-than", "1", "--dry-run", "--json")) == {
        "would_delete": 4, "older_than_days": 1.0}
    assert "pruned 3 replayed or discarded dead letter(s) older than 30 days" in _deadletters()
    assert set(DeadLetter.objects.values_list("pk", flat=True)) == keep
    assert json.loads(_deadletters("--older-than", "1", "--json")) == {"deleted": 1, "older_than_days": 1.0}
    with pytest.raises(CommandError, match="no --id"):
        _deadletters("--actor", "charge")
    # A number no date is that far back: refused, not a traceback.
    for days in ("inf", "nan", "1e6"):
        with pytest.raises(CommandError, match="--older-than must be between 0 and"):
            _deadletters("--older-than", days)
        with pytest.raises(CommandError, match="--older-than must be between 0 and"):
            call_command("outbox", "prune", "--older-than", days, stdout=StringIO())


@pytest.mark.django_db
def test_outbox_prune_defaults_to_the_outbox_retention() -> None:
    outbox_rows(3 * DAY_S, 2)
    out = StringIO()
    with override_settings(COMPOSITION={**settings.COMPOSITION, "OUTBOX_RETENTION_S": 2 * DAY_S}):
        call_command("outbox", "prune", "--json", stdout=out)
    assert json.loads(out.getvalue()) == {"deleted": 2, "older_than_days": 2.0}


# -- runworkers -------------------------------------------------------------------------------------------
@pytest.fixture
def pruning_worker(worker_processes: Any) -> Iterator[Any]:
    overrides = {"RETENTION_INTERVAL_S": 0.5, "RETENTION_BATCH_SIZE": 2}
    worker = worker_processes.spawn(["--threads", "1", "--queues", jobs.IDLE_QUEUE, "--shutdown-timeout", "10"],
                                    COMPOSITION_TEST_OVERRIDES=json.dumps(overrides))
    yield worker
    assert worker.terminate(timeout_s=20) == 0, worker.output()


@pytest.mark.django_db(transaction=True)
def test_runworkers_prunes_on_its_schedule(pruning_worker: Any) -> None:
    keep_ledger = ledger_rows(60, 2, "young")
    # (No pending row here: the worker's relay would send it. Unit tests above cover those.)
    keep_outbox = outbox_rows(60, 1)
    keep_letter = dead_letter(400 * DAY_S, "dead", "unresolved")

    def old_rows() -> int:
        return (ledger_older_than(7 * DAY_S).count()
                + OutboxMessage.objects.filter(status="sent", sent_at__lt=_ago(7 * DAY_S)).count()
                + DeadLetter.objects.exclude(status="dead").count())

    # Two rounds of old rows: the second arrives after the worker has pruned once, so only a
    # repeating schedule (not a prune at start) removes it.
    for round_ in ("first", "second"):
        ledger_rows(8 * DAY_S, 5, f"old-{round_}")
        outbox_rows(8 * DAY_S, 5)
        dead_letter(31 * DAY_S, "replayed", f"old-{round_}")
        wait_until(lambda: old_rows() == 0, 60,
                   message=f"runworkers did not prune the {round_} old rows:\n{pruning_worker.output()[-3000:]}")

    assert set(ProcessedMessage.objects.values_list("pk", flat=True)) == set(keep_ledger)
    assert set(OutboxMessage.objects.values_list("pk", flat=True)) == set(keep_outbox)
    assert list(DeadLetter.objects.values_list("pk", flat=True)) == [keep_letter]
    assert "retention pruned rows" in pruning_worker.output()
