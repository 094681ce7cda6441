"""Every way a message can fail for good ends as exactly one dead letter, or on purpose as none,
with real ``runworkers`` processes against real PostgreSQL and Redis: a database blip while the
dead letter is written, a message for an actor this deploy no longer has, and an actor that opts
out of dead letters (the outbox relay)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError
from dramatiq import Message
from dramatiq.broker import MessageProxy

from composition.broker.configured import configured_broker
from composition.jobs.middleware.dead_letters import DEAD_LETTER_RETRY_DELAYS_S, DeadLetters
from composition.jobs.middleware.stack import find_middleware
from composition.jobs.models import DeadLetter
from composition.outbox.relay import RELAY_ACTOR_NAME, RELAY_QUEUE_NAME, relay_actor
from composition.testing import metric_value, wait_until
from tests.jobsapp import jobs
from tests.jobsapp.apps import FAILURES_ENV
from tests.jobsapp.models import Attempt, Effect

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.empty_queues(jobs.RETRY_QUEUE, jobs.CHECK_QUEUE, RELAY_QUEUE_NAME),
]

THREADS = "2"


def _redis() -> Any:
    return configured_broker().client  # type: ignore[attr-defined]


def in_queue(queue: str) -> int:
    """Messages the broker holds for ``queue`` (waiting, delayed or fetched but not acked)."""
    namespace = configured_broker().namespace  # type: ignore[attr-defined]
    return sum(int(_redis().hlen(f"{namespace}:{name}.msgs")) for name in (queue, f"{queue}.DQ"))


def in_broker_dead_letter_queue(queue: str) -> list[Message[Any]]:
    """What Dramatiq's own (expiring) dead-letter queue holds for ``queue``."""
    namespace = configured_broker().namespace  # type: ignore[attr-defined]
    return [Message.decode(body) for body in _redis().hvals(f"{namespace}:{queue}.XQ.msgs")]


@pytest.mark.slow
def test_dead_letter_written_exactly_once_through_a_database_blip(worker_processes: Any) -> None:
    # Recording fails more often than one handling retries it: the first handling gives up and
    # requeues the message, the second handling records it.
    tries_per_handling = len(DEAD_LETTER_RETRY_DELAYS_S) + 1
    failures = tries_per_handling + 2
    worker = worker_processes.spawn(["--threads", THREADS, "--queues", jobs.RETRY_QUEUE],
                                    **{FAILURES_ENV: str(failures)})
    sent = jobs.refuses.send(key="blip")
    try:
        wait_until(lambda: DeadLetter.objects.filter(actor="refuses").exists(), timeout_s=60, interval_s=0.2)
    except AssertionError:
        pytest.fail(f"no dead letter after the blip; log:\n{worker.output()[-4000:]}")
    # Once recorded, the message leaves the queue (into Dramatiq's DLQ, as every failure does).
    wait_until(lambda: in_queue(jobs.RETRY_QUEUE) == 0, timeout_s=10,
               message="the message is still on its queue after its dead letter was written")

    letter = DeadLetter.objects.get(actor="refuses")
    assert letter.message_id == sent.message_id
    assert (letter.attempts, letter.error_class) == (1, "composition.errors.PermanentError")
    assert "invoice blip can never be paid" in letter.error_message
    assert "raise PermanentError" in letter.traceback  # the run's own traceback, carried by the copy
    # When it first failed travels with the copy: before the first handling's ~3 s of tries.
    assert letter.last_failed_at - letter.first_failed_at >= timedelta(seconds=2)
    runs = list(Attempt.objects.filter(key="blip"))
    # The job ran once: the requeued copy only carried its dead letter (a job's effects, an
    # email say, must not happen again because the database was away when it was recorded).
    assert [run.attempt for run in runs] == [1]
    assert [m.message_id for m in in_broker_dead_letter_queue(jobs.RETRY_QUEUE)] == [sent.message_id]
    assert "requeued" in worker.output()
    [dead_lettered] = [json.loads(line) for line in worker.output().splitlines()
                       if line.startswith("{") and '"job dead-lettered"' in line]
    assert dead_lettered["payload"] == {"key": "blip"}  # which one it was, in the line itself

    # The worker carries on: the next failure is recorded at the first try.
    jobs.refuses.send(key="after-blip")
    wait_until(lambda: DeadLetter.objects.filter(payload={"key": "after-blip"}).exists(), timeout_s=30,
               message=f"worker stopped after the blip; log:\n{worker.output()[-3000:]}")
    assert DeadLetter.objects.filter(actor="refuses").count() == 2
    assert worker.terminate() == 0


@pytest.mark.slow
def test_message_for_an_unknown_actor_becomes_a_grouped_dead_letter(worker_processes: Any) -> None:
    worker = worker_processes.spawn(["--threads", THREADS, "--queues", jobs.CHECK_QUEUE])
    broker = configured_broker()
    # What an older deploy may still have queued: a job that was removed (or renamed) since.
    removed = [Message(queue_name=jobs.CHECK_QUEUE, actor_name="removed_job", args=(),
                       kwargs={"invoice_id": invoice_id}, options={"composition": {"outbox_id": invoice_id}})
               for invoice_id in (41, 42)]
    for message in removed:
        broker.enqueue(message)
    try:
        wait_until(lambda: DeadLetter.objects.filter(actor="removed_job").count() == 2, timeout_s=30)
    except AssertionError:
        pytest.fail(f"unknown actor not dead-lettered; log:\n{worker.output()[-4000:]}")

    letters = {letter.message_id: letter for letter in DeadLetter.objects.filter(actor="removed_job")}
    assert set(letters) == {message.message_id for message in removed}
    for message in removed:
        letter = letters[message.message_id]
        # Parked at once (the tests' DEPLOY_WINDOW_S is 0) in the deploys' own group.
        assert letter.error_class == "composition.errors.IncompatibleMessageError"
        assert "no job named 'removed_job' here" in letter.error_message
        assert (letter.queue, letter.payload, letter.attempts) == (jobs.CHECK_QUEUE, message.kwargs, 1)
        assert letter.headers == {"outbox_id": message.kwargs["invoice_id"]}
    assert len({letter.fingerprint for letter in letters.values()}) == 1, "one cause, one group"

    # The worker keeps running.
    jobs.typed.send(invoice_id=7, note="alive")
    wait_until(lambda: Effect.objects.filter(key="typed-7-alive").exists(), timeout_s=30,
               message=f"the worker stopped after an unknown actor; log:\n{worker.output()[-3000:]}")
    assert worker.process is not None and worker.process.poll() is None
    assert DeadLetter.objects.filter(actor="removed_job").count() == 2
    assert worker.terminate() == 0


@pytest.mark.slow
def test_actor_declared_without_dead_letters_writes_none(worker_processes: Any) -> None:
    worker = worker_processes.spawn(["--threads", THREADS, "--queues", jobs.CHECK_QUEUE])
    quiet = jobs.fails_without_dead_letter.send(key="quiet")
    loud = jobs.charge.send(account="nobody", key="loud")  # an ordinary job that fails for good
    try:
        wait_until(lambda: {m.message_id for m in in_broker_dead_letter_queue(jobs.CHECK_QUEUE)}
                   == {quiet.message_id, loud.message_id}, timeout_s=30)
    except AssertionError:
        pytest.fail(f"messages not processed; log:\n{worker.output()[-4000:]}")
    wait_until(lambda: DeadLetter.objects.filter(message_id=loud.message_id).exists(), timeout_s=10)
    assert not DeadLetter.objects.filter(actor="jobsapp_fails_without_dead_letter").exists()
    assert worker.terminate() == 0


def test_the_outbox_relay_actor_opts_out_of_dead_letters() -> None:
    broker = configured_broker()
    relay = relay_actor(broker)
    assert relay.options["dead_letter"] is False
    middleware = find_middleware(broker, DeadLetters)
    assert middleware is not None

    # A nudge that failed for good (max_retries=0), as a database blip in the relay would make it.
    message = MessageProxy(Message(queue_name=RELAY_QUEUE_NAME, actor_name=RELAY_ACTOR_NAME, args=(),
                                   kwargs={}, options={}))
    message.fail()
    middleware.after_process_message(broker, message, exception=OperationalError("database blip"))
    assert not DeadLetter.objects.exists()

    # The same failure of an ordinary job is recorded.
    message = MessageProxy(Message(queue_name=jobs.CHECK_QUEUE, actor_name="charge", args=(),
                                   kwargs={"account": "a", "key": "k"}, options={}))
    message.fail()
    middleware.after_process_message(broker, message, exception=OperationalError("database blip"))
    assert DeadLetter.objects.filter(message_id=message.message_id).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_message_expired_unrun_past_its_max_age_becomes_a_dead_letter() -> None:
    # Dramatiq's AgeLimit fails and skips a message older than its max_age: only the broker's
    # expiring dead-letter queue held it. It is recorded like a job that failed for good.
    from dramatiq.middleware import AgeLimit, SkipMessage

    broker = configured_broker()
    message = MessageProxy(Message(queue_name=jobs.CHECK_QUEUE, actor_name="charge", args=(),
                                   kwargs={"account": "acme", "key": "old"}, options={"max_age": 1000},
                                   message_timestamp=1))
    with pytest.raises(SkipMessage):
        find_middleware(broker, AgeLimit).before_process_message(broker, message)
    find_middleware(broker, DeadLetters).after_skip_message(broker, message)
    [letter] = DeadLetter.objects.filter(message_id=message.message_id)
    assert letter.error_class.endswith("PermanentError") and "max_age (1000 ms)" in letter.error_message
    assert letter.payload == {"account": "acme", "key": "old"}


@pytest.mark.django_db(transaction=True)
def test_a_copy_waiting_for_its_dead_letter_is_recorded_not_run_whoever_skips_it() -> None:
    # A copy requeued while the database was away carries its failure. Expired meanwhile, it is
    # skipped by AgeLimit before DeadLetters sees it: still recorded with the job's own failure,
    # not as expired unrun. A hand-made copy with a garbled option is recorded, not lost.
    from dramatiq.middleware import AgeLimit, SkipMessage

    from composition.jobs.middleware.dead_letters import DEAD_LETTER_PENDING_OPTION

    broker = configured_broker()
    dead_letters = find_middleware(broker, DeadLetters)
    assert dead_letters is not None
    failure = {"error_class": "billing.errors.CardDeclined", "error_message": "card declined",
               "traceback": "Traceback (most recent call last): ...", "attempts": 4}
    expired = MessageProxy(Message(queue_name=jobs.CHECK_QUEUE, actor_name="charge", args=(),
                                   kwargs={"account": "acme", "key": "expired"}, message_timestamp=1,
                                   options={"max_age": 1000, DEAD_LETTER_PENDING_OPTION: failure}))
    with pytest.raises(SkipMessage):
        find_middleware(broker, AgeLimit).before_process_message(broker, expired)
    dead_letters.after_skip_message(broker, expired)
    garbled = MessageProxy(Message(queue_name=jobs.CHECK_QUEUE, actor_name="charge", args=(),
                                   kwargs={"account": "acme", "key": "garbled"},
                                   options={DEAD_LETTER_PENDING_OPTION: "not a failure"}))
    with pytest.raises(SkipMessage):
        dead_letters.before_process_message(broker, garbled)
    dead_letters.after_skip_message(broker, garbled)

    letter = DeadLetter.objects.get(message_id=expired.message_id)
    assert (letter.error_class, letter.error_message, letter.attempts) == ("billing.errors.CardDeclined",
                                                                           "card declined", 4)
    assert expired.failed  # recorded as every failure is: the consumer nacks it into the broker's DLQ
    assert "unreadable" in DeadLetter.objects.get(message_id=garbled.message_id).error_message


@pytest.mark.parametrize("committed_elsewhere", [True, False])
def test_an_idempotent_job_another_delivery_committed_leaves_no_dead_letter(committed_elsewhere: bool) -> None:
    # A host cut off from the network fails a job whose redelivered copy ran elsewhere: its
    # failure is no dead letter (a replay would do nothing); without the ledger row it is one.
    from django.db import transaction

    from composition.jobs.inbox import ledger_key, record_processed
    from composition.jobs.middleware.dead_letters import write_dead_letter

    message = MessageProxy(jobs.crash_effect.message_with_options(kwargs={"key": "elsewhere"}))
    if committed_elsewhere:
        with transaction.atomic():
            assert record_processed(ledger_key(message), jobs.crash_effect.actor_name)
    lost = metric_value("composition_dead_letter_record_failures_total", actor=jobs.crash_effect.actor_name,
                        outcome="broker_dlq")
    write_dead_letter(configured_broker(), message, OperationalError("the connection was cut"), 1)
    assert DeadLetter.objects.filter(message_id=message.message_id).exists() is not committed_elsewhere
    # Not a recording that failed: the check that found the ledger row was taken for one, logged
    # critical and counted as a dead letter left to the broker's expiring queue.
    assert metric_value("composition_dead_letter_record_failures_total", actor=jobs.crash_effect.actor_name,
                        outcome="broker_dlq") == lost


def test_a_dead_letter_refused_by_a_read_only_database_is_requeued_to_be_recorded_later(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A primary demoted in a failover (or a pooler still on a standby) refuses writes with
    # SQLSTATE 25006, an InternalError: taken for an error that would fail the same way every
    # time, the letter was left only in the broker's expiring dead-letter queue.
    from django.db import connection

    from composition.jobs.middleware import dead_letters
    from composition.jobs.middleware.dead_letters import DEAD_LETTER_PENDING_OPTION, write_dead_letter

    monkeypatch.setattr(dead_letters, "DEAD_LETTER_RETRY_DELAYS_S", (0.01,))
    message = MessageProxy(jobs.refuses.message_with_options(kwargs={"key": "read-only"}))
    requeued: list[MessageProxy] = []
    with connection.cursor() as cursor:
        cursor.execute("SET default_transaction_read_only = on")
    try:
        write_dead_letter(configured_broker(), message, RuntimeError("failed for good"), 3,
                          requeue=lambda _, copy: requeued.append(copy))
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET default_transaction_read_only = off")
    assert requeued == [message], "left only in the broker's expiring dead-letter queue"
    assert message.options[DEAD_LETTER_PENDING_OPTION]["error_message"] == "failed for good"
    assert not DeadLetter.objects.filter(message_id=message.message_id).exists()


def test_a_job_whose_exception_cannot_be_printed_is_retried_then_dead_lettered() -> None:
    # str() of the exception raised in JobRetries' after-hook: Dramatiq logged that and acked the
    # message, neither retried nor recorded.
    from composition.jobs.middleware.dead_letters import write_dead_letter
    from composition.jobs.middleware.retries import JobRetries

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("cannot say itself")

    broker = configured_broker()
    retries = next(m for m in broker.middleware if isinstance(m, JobRetries))
    message = MessageProxy(jobs.refuses.message_with_options(kwargs={"key": "unprintable"}))
    retries.after_process_message(broker, message, exception=Unprintable())
    assert not message.failed and message.options["retries"] == 1, "not retried"
    write_dead_letter(broker, message, Unprintable(), 2)
    letter = DeadLetter.objects.get(message_id=message.message_id)
    assert letter.error_message == "<unprintable Unprintable: its __str__ raised RuntimeError>"

    # Whatever else goes wrong deciding the retry fails the message, for its dead letter.
    garbled = MessageProxy(jobs.refuses.message_with_options(kwargs={"key": "garbled"}, retries="many"))
    retries.after_process_message(broker, garbled, exception=RuntimeError("transient"))
    assert garbled.failed
