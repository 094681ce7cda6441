"""``composition.testing.run_queued_jobs``: what is queued runs in the test's own process, on the
real broker and database, through the worker's own middleware."""

from __future__ import annotations

import time

import pytest
from django.db import connection, transaction

from composition.backpressure.depth import broker_counts
from composition.broker.configured import configured_broker
from composition.errors import PermanentError
from composition.jobs.models import DeadLetter
from composition.outbox import publish, publish_many
from composition.outbox.models import OutboxMessage
from composition.testing import JobsFailed, left_to_the_relay, metric_value, run_queued_jobs
from tests.helpers import unique
from tests.jobsapp import jobs
from tests.jobsapp.models import Attempt, Effect

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.empty_queues(jobs.INLINE_QUEUE, jobs.RETRY_QUEUE)]


def _backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def test_a_chain_of_jobs_runs_to_its_end_and_each_run_is_reported() -> None:
    key = unique("chain")
    with transaction.atomic():
        publish(jobs.inline_chain, {"key": key, "left": 3})
    backends, middleware = _backends(), list(configured_broker().middleware)

    report = run_queued_jobs(jobs.INLINE_QUEUE)

    # Each link published the next from inside its own run: all four ran, in order.
    assert [(run.actor_name, run.payload["left"], run.outcome) for run in report.runs] == [
        ("inline_chain", left, "success") for left in (3, 2, 1, 0)]
    assert report.count("success", actor="inline_chain") == 4 and report.failures == ()
    assert sorted(Effect.objects.filter(key__startswith=key).values_list("key", flat=True)) == [
        f"{key}-{left}" for left in (0, 1, 2, 3)]
    assert not OutboxMessage.objects.filter(actor_name="inline_chain", status="pending").exists()
    counts = broker_counts(jobs.INLINE_QUEUE)
    assert (counts.ready, counts.in_flight) == (0, 0)
    # The worker threads closed their connections as they stopped (the test database can be
    # dropped), and the stopped worker left no middleware on the broker to start consumers later.
    assert _backends() == backends
    assert configured_broker().middleware == middleware


def test_a_failed_run_raises_with_the_job_s_own_exception_and_is_dead_lettered() -> None:
    key = unique("refused")
    with transaction.atomic():
        publish(jobs.refuses, {"key": key})

    with pytest.raises(JobsFailed) as failed:
        run_queued_jobs(jobs.RETRY_QUEUE)

    assert isinstance(failed.value.__cause__, PermanentError)
    assert f"refuses ({failed.value.report.runs[0].message_id}) dead" in str(failed.value)
    assert failed.value.report.count("dead") == 1
    assert DeadLetter.objects.filter(actor="refuses", payload__key=key).count() == 1


def test_retries_wait_in_their_backoff_unless_delayed_runs_them_too() -> None:
    key = unique("flaky")
    with transaction.atomic():
        publish(jobs.inline_flaky, {"key": key, "fail_times": 2})

    first = run_queued_jobs(jobs.INLINE_QUEUE, raise_failures=False)
    assert [run.outcome for run in first.runs][:1] == ["retry"]
    assert isinstance(first.runs[0].exception, jobs.TransientError)

    # The backoff is 2 s: the first call returned before the retry came due.
    assert Attempt.objects.filter(key=key).count() == 1
    rest = run_queued_jobs(jobs.INLINE_QUEUE, delayed=True, raise_failures=False)
    runs = first.runs + rest.runs
    assert [run.outcome for run in runs] == ["retry", "retry", "success"]
    assert list(Attempt.objects.filter(key=key).order_by("attempt").values_list("attempt", flat=True)) == [1, 2, 3]
    assert Effect.objects.filter(key=key).count() == 1


def test_a_message_not_yet_due_is_left_where_it_is() -> None:
    key = unique("later")
    with transaction.atomic():
        publish(jobs.inline_chain, {"key": key, "left": 0}, delay_s=60)
        publish(jobs.inline_chain, {"key": key + "-now", "left": 0})

    started = time.monotonic()
    report = run_queued_jobs(jobs.INLINE_QUEUE)

    assert time.monotonic() - started < 10
    assert [run.payload["key"] for run in report.runs] == [key + "-now"]
    assert broker_counts(jobs.INLINE_QUEUE).delayed + OutboxMessage.objects.filter(
        actor_name="inline_chain", payload__key=key, status="pending").count() == 1
    assert not Effect.objects.filter(key=f"{key}-0").exists()


def test_rows_left_to_the_relay_are_relayed_first() -> None:
    key = unique("relayed")
    with left_to_the_relay(), transaction.atomic():
        publish(jobs.inline_chain, {"key": key, "left": 1})
    assert OutboxMessage.objects.filter(actor_name="inline_chain", payload__key=key, status="pending").count() == 1

    report = run_queued_jobs(jobs.INLINE_QUEUE)

    assert report.count("success") == 2
    assert Effect.objects.filter(key__startswith=key).count() == 2


def test_bad_calls_are_refused_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="no job declares queue 'nope'"):
        run_queued_jobs("nope")
    with pytest.raises(ValueError, match="timeout_s"):
        run_queued_jobs(jobs.INLINE_QUEUE, timeout_s=0)
    with transaction.atomic(), pytest.raises(RuntimeError, match="TransactionTestCase"):
        run_queued_jobs(jobs.INLINE_QUEUE)
    with pytest.raises(ValueError, match="not an outcome"):
        run_queued_jobs(jobs.INLINE_QUEUE).count("succeeded")


def test_work_still_held_after_the_timeout_is_a_timeout_error() -> None:
    key = unique("long")
    with transaction.atomic():
        publish(jobs.inline_chain, {"key": key, "left": 0}, delay_s=60)

    with pytest.raises(TimeoutError, match="1 delayed"):
        run_queued_jobs(jobs.INLINE_QUEUE, delayed=True, timeout_s=1)
    # Handed back as the in-process worker stopped, still waiting for its time.
    assert broker_counts(jobs.INLINE_QUEUE).delayed == 1


def test_a_job_past_its_expiry_is_dropped_unrun_and_counted_not_dead_lettered() -> None:
    key = unique("expiring")
    expired_before = metric_value("composition_jobs_total", actor="inline_chain", outcome="expired")
    with transaction.atomic():
        publish(jobs.inline_chain, {"key": key + "-late", "left": 0}, expires_s=0.2)
        publish(jobs.inline_chain, {"key": key + "-in-time", "left": 0}, expires_s=60)
        publish_many(jobs.inline_chain, [{"key": key + "-late-too", "left": 0}], expires_s=0.2)
    time.sleep(0.3)

    report = run_queued_jobs(jobs.INLINE_QUEUE)

    assert sorted((run.payload["key"][len(key):], run.outcome) for run in report.runs) == [
        ("-in-time", "success"), ("-late", "expired"), ("-late-too", "expired")]
    assert report.failures == ()
    assert list(Effect.objects.filter(key__startswith=key).values_list("key", flat=True)) == [f"{key}-in-time-0"]
    assert not DeadLetter.objects.filter(actor="inline_chain").exists()
    counts = broker_counts(jobs.INLINE_QUEUE)
    assert (counts.ready, counts.in_flight, counts.delayed) == (0, 0, 0)  # acknowledged, not retried
    assert metric_value("composition_jobs_total", actor="inline_chain", outcome="expired") == expired_before + 2


def test_a_retry_that_comes_due_after_the_expiry_is_dropped() -> None:
    key = unique("expiring-retry")
    with transaction.atomic():  # the 2 s backoff outlasts the 1 s expiry
        publish(jobs.inline_flaky, {"key": key, "fail_times": 1}, expires_s=1)

    report = run_queued_jobs(jobs.INLINE_QUEUE, delayed=True, raise_failures=False)

    assert [run.outcome for run in report.runs] == ["retry", "expired"]
    assert Attempt.objects.filter(key=key).count() == 1 and not Effect.objects.filter(key=key).exists()


@pytest.mark.empty_queues(jobs.SLOW_QUEUE)
def test_the_timeout_bounds_the_call_even_with_a_job_still_running() -> None:
    """timeout_s is when the call gives up: a job still running then is cut short (its message
    handed back), not waited for up to SHUTDOWN_TIMEOUT_S more."""
    key = unique("overrun")
    with transaction.atomic():
        publish(jobs.slow, {"key": key, "hold_s": 20.0})

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        run_queued_jobs(jobs.SLOW_QUEUE, timeout_s=1)

    assert time.monotonic() - started < 6
    assert not Effect.objects.filter(key=key).exists()


def test_delayed_waits_for_a_row_held_in_the_outbox_too(settings) -> None:  # type: ignore[no-untyped-def]
    """A delay over OUTBOX_HELD_DELAY_S waits in the outbox, not the broker: delayed=True waits
    for it as for any other message not yet due, rather than returning with it unrun."""
    settings.COMPOSITION = {**settings.COMPOSITION, "OUTBOX_HELD_DELAY_S": 0.5}
    key = unique("held")
    with transaction.atomic():
        publish(jobs.inline_chain, {"key": key, "left": 0}, delay_s=1.5)

    report = run_queued_jobs(jobs.INLINE_QUEUE, delayed=True, timeout_s=10)

    assert [run.outcome for run in report.runs] == ["success"]
    assert Effect.objects.filter(key=f"{key}-0").exists()
