"""Jobs run by real ``runworkers`` processes against real PostgreSQL and Redis: retries, dead
letters, malformed payloads, and exactly-once effects through repeated SIGKILLs."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.db.models import Count

from composition.broker.configured import configured_broker
from composition.errors import IncompatibleMessageError
from composition.jobs.models import DeadLetter, ProcessedMessage
from composition.outbox import OutboxMessage, publish
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.testing import wait_until
from tests.jobsapp import jobs
from tests.jobsapp.models import Attempt, Effect

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.empty_queues(jobs.CRASH_QUEUE, jobs.RETRY_QUEUE, jobs.CHECK_QUEUE, RELAY_QUEUE_NAME),
]

# Few threads: PostgreSQL's 100 connections are shared with the other suites.
THREADS = "4"


def attempts_of(key: str) -> list[Attempt]:
    return list(Attempt.objects.filter(key=key).order_by("attempt"))


def test_retry_policy_end_to_end(worker_processes) -> None:
    worker = worker_processes.spawn(["--threads", THREADS, "--queues", jobs.RETRY_QUEUE])
    jobs.flaky.send(key="flaky", fail_times=2)
    jobs.refuses.send(key="refuses")
    jobs.lookup.send(key="lookup")
    jobs.always_fails.send(key="exhausted")

    wait_until(lambda: Effect.objects.filter(key="flaky").exists()
               and DeadLetter.objects.filter(actor__in=["refuses", "lookup", "always_fails"]).count() == 3,
               timeout_s=60, message=f"jobs did not settle; worker log:\n{worker.output()[-3000:]}")

    # A job failing transiently twice succeeds on attempt 3, after growing delays within bounds.
    runs = attempts_of("flaky")
    assert [run.attempt for run in runs] == [1, 2, 3]
    delays_ms = [run.backoff_ms for run in runs[1:]]
    initial_ms, max_ms = 50, 300  # the job's initial_delay_s and max_delay_s
    assert all(delay is not None and initial_ms <= delay <= max_ms for delay in delays_ms), delays_ms
    assert delays_ms[0] < delays_ms[1], delays_ms
    assert Effect.objects.filter(key="flaky").count() == 1
    assert not DeadLetter.objects.filter(actor="flaky").exists()

    # A permanent error (ours, or a type the job declared permanent) dead-letters after 1 attempt.
    for actor, key, error_class in (("refuses", "refuses", "composition.errors.PermanentError"),
                                    ("lookup", "lookup", "KeyError")):
        assert [run.attempt for run in attempts_of(key)] == [1]
        dead = DeadLetter.objects.get(actor=actor)
        assert (dead.attempts, dead.error_class, dead.status) == (1, error_class, "dead")
        assert dead.payload == {"key": key}
        assert error_class.rsplit(".", 1)[-1] in dead.traceback

    # Exhausting max_attempts dead-letters with attempts = max_attempts.
    assert [run.attempt for run in attempts_of("exhausted")] == [1, 2, 3]
    dead = DeadLetter.objects.get(actor="always_fails")
    assert dead.attempts == 3
    assert dead.error_class == "ValueError"
    assert dead.error_message == "unexpected failure for exhausted"
    assert dead.first_failed_at < dead.last_failed_at
    assert dead.queue == jobs.RETRY_QUEUE
    assert worker.terminate() == 0


def test_malformed_payload_is_dead_lettered_and_the_worker_keeps_running(worker_processes) -> None:
    worker = worker_processes.spawn(["--threads", THREADS, "--queues", jobs.CHECK_QUEUE])
    # What an old deploy might still send: a string id, and an argument the job no longer has.
    jobs.typed.send_with_options(kwargs={"invoice_id": "41"})
    jobs.typed.send_with_options(kwargs={"invoice_id": "42"})
    jobs.typed.send_with_options(kwargs={"invoice": 43})
    # A list's elements are checked too, not only that it is a list.
    jobs.typed_batch.send_with_options(kwargs={"invoice_ids": [45, "46"]})
    wait_until(lambda: DeadLetter.objects.filter(actor__in=["typed", "typed_batch"]).count() == 4, timeout_s=30,
               message=f"malformed payloads not dead-lettered; log:\n{worker.output()[-3000:]}")
    jobs.typed.send(invoice_id=44, note="fine")
    wait_until(lambda: Effect.objects.filter(key="typed-44-fine").exists(), timeout_s=30,
               message="the worker stopped working after malformed payloads")

    letters = {str(letter.payload): letter for letter in DeadLetter.objects.filter(actor="typed")}
    assert all(letter.attempts == 1 for letter in letters.values()), "a validation error is never retried"
    # A payload that does not fit is incompatible with the running code (parked at once: the
    # tests' DEPLOY_WINDOW_S is 0), a PayloadValidationError of its own group.
    error_class = f"{IncompatibleMessageError.__module__}.{IncompatibleMessageError.__qualname__}"
    assert {letter.error_class for letter in letters.values()} == {error_class}
    first, second = letters["{'invoice_id': '41'}"], letters["{'invoice_id': '42'}"]
    renamed = letters["{'invoice': 43}"]
    assert "argument 'invoice_id' must be int, got str" in first.error_message
    assert "unexpected keyword argument 'invoice'" in renamed.error_message
    # Same cause, same group: the two string ids share a fingerprint, the renamed argument not.
    assert first.fingerprint == second.fingerprint != renamed.fingerprint
    batch = DeadLetter.objects.get(actor="typed_batch")
    assert (batch.attempts, batch.error_class) == (1, error_class)
    assert "argument 'invoice_ids' must be list[int], got str at invoice_ids[1]" in batch.error_message
    assert not Effect.objects.filter(key__startswith="typed-batch").exists()
    assert worker.process is not None and worker.process.poll() is None
    assert worker.terminate() == 0


def _pending_in_broker(queue: str) -> int:
    """Messages the broker still holds for ``queue`` (queued, delayed or fetched-unacked)."""
    broker = configured_broker()
    client = broker.client  # type: ignore[attr-defined]
    return sum(int(client.hlen(f"{broker.namespace}:{name}.msgs")) for name in (queue, f"{queue}.DQ"))


# The gate's storm: 600 jobs through 3 kills; CI size under soak (make soak): 2,000 through 5.
@pytest.mark.main_cell  # process timing no Python or Django version changes
@pytest.mark.parametrize(("total", "storm"), [pytest.param(600, 3, id="gate"),
                                              pytest.param(2_000, 5, id="ci", marks=pytest.mark.soak)])
def test_sigkill_storm_leaves_every_effect_exactly_once(worker_processes, total: int, storm: int) -> None:
    with transaction.atomic():
        for index in range(total):
            publish(jobs.crash_effect, {"key": f"c{index}"})
    args = ["--threads", THREADS, "--queues", f"{jobs.CRASH_QUEUE},{RELAY_QUEUE_NAME}"]

    kills = 0
    while kills < storm:
        worker = worker_processes.spawn(args)
        before = Effect.objects.count()
        # Kill once the worker is visibly mid-stream, so kills land between and inside jobs.
        try:
            wait_until(lambda b=before: Effect.objects.count() >= b + 40, timeout_s=60)
        except AssertionError:
            pytest.fail(f"no progress after {kills} kills: {Effect.objects.count()} effects, "
                        f"{OutboxMessage.objects.filter(status='pending').count()} outbox pending, "
                        f"{_pending_in_broker(jobs.CRASH_QUEUE)} in the broker; log:\n{worker.output()[-3000:]}")
        worker.kill_group()
        kills += 1
    assert Effect.objects.values("key").distinct().count() < total, "the storm ended before the backlog did"

    worker = worker_processes.spawn(args)
    # The killed workers' unacked messages come back after BROKER_HEARTBEAT_TIMEOUT_S (4 s),
    # not Dramatiq's 60 s default plus a 1-in-1,000 maintenance chance.
    try:
        wait_until(lambda: _pending_in_broker(jobs.CRASH_QUEUE) == 0
                   and not OutboxMessage.objects.filter(status="pending").exists()
                   and Effect.objects.values("key").distinct().count() == total,
                   timeout_s=50, interval_s=0.5)
    except AssertionError:
        pytest.fail(f"backlog not finished: {_pending_in_broker(jobs.CRASH_QUEUE)} pending; "
                    f"log:\n{worker.output()[-3000:]}")

    counts = Effect.objects.values("key").annotate(n=Count("id"))
    assert len(counts) == total
    duplicates = [row for row in counts if row["n"] != 1]
    assert duplicates == [], f"effects not exactly once: {duplicates[:10]}"
    assert ProcessedMessage.objects.filter(actor="crash_effect").count() == total
    assert not DeadLetter.objects.filter(actor="crash_effect").exists()
    assert worker.terminate() == 0
