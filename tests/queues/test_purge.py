"""``purge_queue`` and ``manage.py queues purge``: a paused queue's waiting work (unsent outbox
rows, ready and delayed broker messages) becomes open dead letters, and replaying them runs each
job once; a purge cut short loses nothing and records nothing twice; what it refuses."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.utils import timezone
from dramatiq.common import dq_name
from dramatiq.message import Message

from composition.backpressure.depth import broker_counts
from composition.broker.configured import configured_broker
from composition.broker.keys import messages_key, queue_key
from composition.broker.purging import BATCH, take_waiting
from composition.jobs.models import DeadLetter
from composition.outbox import OutboxMessage, publish
from composition.outbox.enqueue import enqueue_many
from composition.outbox.relay import RELAY_QUEUE_NAME, Relay
from composition.pauses import Pause
from composition.queues import QueueNotPausable, QueueNotPaused, pause_queue, purge_queue, resume_queue
from composition.sampling.queues import open_dead_letters_by_actor
from composition.testing import left_to_the_relay, run_queued_jobs, subprocess_env, use_broker, wait_until
from tests.helpers import RABBITMQ_URL, ROOT
from tests.jobsapp import jobs
from tests.jobsapp.models import Effect

QUEUE = jobs.PAUSE_QUEUE


def _settled_pause(queue: str) -> None:
    """Pause ``queue`` as if every worker had read it long ago (a purge waits for that)."""
    pause_queue(queue, by="ops", reason="bad deploy")
    Pause.objects.filter(kind=Pause.QUEUE, name=queue).update(changed_at=timezone.now() - timedelta(seconds=10))


def _publish(keys: Sequence[str], **options: object) -> None:
    with transaction.atomic():
        for key in keys:
            publish(jobs.pause_run, {"key": key, "hold_s": 0.0}, **options)  # type: ignore[arg-type]


def _unsent() -> int:
    return OutboxMessage.objects.filter(queue_name=QUEUE).exclude(status=OutboxMessage.Status.SENT).count()


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("queues", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
@pytest.mark.empty_queues(QUEUE)
def test_a_purge_takes_outbox_rows_and_ready_and_delayed_messages_and_a_replay_runs_each_once() -> None:
    with left_to_the_relay():
        _publish(["o1", "o2", "o3"])
    _publish(["b1", "b2", "b3", "b4"])
    _publish(["d1"], delay_s=60)  # on the broker's delay queue, no worker holds it
    broker = configured_broker()
    assert _unsent() == 3 and broker_counts(QUEUE, broker).ready == 4 and broker_counts(QUEUE, broker).delayed == 1
    _settled_pause(QUEUE)

    said = _run("purge", QUEUE)  # without --yes: what it would take, nothing done
    assert said.strip() == (f"queue {QUEUE}: 3 outbox rows and 5 broker messages wait; purge --yes makes them dead "
                            "letters")
    assert _unsent() == 3

    said = _run("purge", QUEUE, "--yes", "--by", "alice", "--reason", "bad deploy 42")
    assert f"queue {QUEUE} purged: 8 dead letters (3 from the outbox, 5 from the broker)" in said
    letters = DeadLetter.objects.filter(queue=QUEUE)
    assert sorted(letter.payload["key"] for letter in letters) == ["b1", "b2", "b3", "b4", "d1", "o1", "o2", "o3"]
    assert {(letter.status, letter.error_class, letter.error_message, letter.attempts) for letter in letters} == {
        ("dead", "composition.jobs.deadletters.Purged", f"purged from queue {QUEUE} by alice: bad deploy 42", 0)}
    assert len({letter.fingerprint for letter in letters}) == 1  # one group to replay or discard
    assert jobs.pause_run.actor_name not in open_dead_letters_by_actor()  # an operator's act pages no one
    counts = broker_counts(QUEUE, broker)
    assert (_unsent(), counts.ready, counts.delayed, counts.in_flight) == (0, 0, 0, 0)
    assert _run("purge", QUEUE, "--yes").startswith(f"queue {QUEUE} purged: 0 dead letters")

    resume_queue(QUEUE, by="ops")
    assert run_queued_jobs(QUEUE).count() == 0  # nothing left to run
    out = io.StringIO()
    call_command("deadletters", "replay", "--error", "Purged", "--yes", stdout=out)  # as operations.md says
    assert "8" in out.getvalue() and not DeadLetter.objects.filter(status="dead").exists()
    assert run_queued_jobs(QUEUE).count("success") == 8
    assert sorted(Effect.objects.values_list("key", flat=True)) == ["b1", "b2", "b3", "b4", "d1", "o1", "o2", "o3"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.empty_queues(QUEUE)
def test_a_purge_cut_short_on_redis_leaves_its_batch_held_and_the_next_purge_records_it_once() -> None:
    _publish([f"k{n}" for n in range(7)])
    broker = configured_broker()
    recorded: list[bytes] = []

    def dies_after_one_batch(bodies: Sequence[bytes]) -> None:
        recorded.extend(bodies)
        raise RuntimeError("the purging process died here")

    with pytest.raises(RuntimeError):
        take_waiting(broker, QUEUE, dies_after_one_batch, limit=100)
    assert len(recorded) == 7 and broker_counts(QUEUE, broker).ready == 0  # off the queue, held, not lost
    # A letter the dead purge had committed is not recorded twice.
    first = Message.decode(recorded[0])
    DeadLetter.objects.create(actor=first.actor_name, queue=QUEUE, message_id=first.message_id, payload=first.kwargs,
                              attempts=0, error_class="x", fingerprint="f", first_failed_at=timezone.now(),
                              last_failed_at=timezone.now())
    _settled_pause(QUEUE)
    result = purge_queue(QUEUE, by="ops")
    assert result.from_broker == 7 and DeadLetter.objects.filter(queue=QUEUE).count() == 7
    assert take_waiting(broker, QUEUE, dies_after_one_batch, limit=100) == 0  # nothing held any more


@pytest.mark.django_db(transaction=True)
@pytest.mark.empty_queues(QUEUE)
def test_what_a_purge_refuses_and_the_json_it_prints() -> None:
    with pytest.raises(QueueNotPaused, match=f"queue '{QUEUE}' is not paused: pause it first"):
        purge_queue(QUEUE, by="ops")
    with pytest.raises(CommandError, match="is not paused"):
        _run("purge", QUEUE, "--yes")
    with pytest.raises(QueueNotPausable, match="no queue named 'jobs_nope'"):
        purge_queue("jobs_nope", by="ops")
    with pytest.raises(QueueNotPausable, match="outbox relay's queue"):
        purge_queue(RELAY_QUEUE_NAME, by="ops")
    for args, says in ((("purge",), "purge needs a queue's name"),
                       (("list", "--yes"), "--yes is for purge, not list"),
                       (("list", "--by", "ops"), "--by and --reason are for pause, resume and purge, not list")):
        with pytest.raises(CommandError, match=says):
            _run(*args)
    with left_to_the_relay():
        _publish(["j1", "j2"])
    assert json.loads(_run("purge", QUEUE, "--json")) == {"queue": QUEUE, "purged": False, "paused": False,
                                                          "outbox": 2, "broker": 0}
    assert _run("purge", QUEUE).strip() == (f"queue {QUEUE}: 2 outbox rows and 0 broker messages wait; pause it first "
                                            f"(queues pause {QUEUE}), then purge --yes makes them dead letters")
    _settled_pause(QUEUE)
    assert json.loads(_run("purge", QUEUE, "--yes", "--json")) == {
        "queue": QUEUE, "purged": True, "outbox": 2, "broker": 0, "held_by_workers": 0}


@pytest.mark.rabbitmq
@pytest.mark.django_db(transaction=True)
@pytest.mark.empty_queues(jobs.RABBIT_QUEUE, rabbitmq=True)
def test_a_rabbitmq_purge_takes_ready_and_delayed_messages_and_one_cut_short_hands_its_batch_back() -> None:
    queue = jobs.RABBIT_QUEUE
    with use_broker(RABBITMQ_URL) as broker:
        broker.declare_actor(jobs.rabbit_effect)
        ids = []
        for n in range(6):
            message = jobs.rabbit_effect.message_with_options(kwargs={"key": f"r{n}"})
            ids.append(message.message_id)
            broker.enqueue(message, delay=60_000 if n == 5 else None)

        def dies(bodies: Sequence[bytes]) -> None:
            raise RuntimeError("the purging process died here")

        with pytest.raises(RuntimeError):
            take_waiting(broker, queue, dies, limit=100)
        assert broker_counts(queue, broker).ready == 5  # handed back with the connection
        _settled_pause(queue)
        result = purge_queue(queue, by="ops")
        assert (result.from_outbox, result.from_broker, result.held_by_workers) == (0, 6, None)
        letters = DeadLetter.objects.filter(queue=queue)
        assert sorted(letters.values_list("message_id", flat=True)) == sorted(ids)
        assert broker_counts(queue, broker).ready == 0 and broker_counts(dq_name(queue), broker).ready == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.empty_queues(QUEUE)
def test_an_unreadable_or_oversized_body_on_redis_becomes_a_letter_with_its_text() -> None:
    broker = configured_broker()
    client, namespace = broker.client, broker.namespace  # type: ignore[attr-defined]
    body = b"\xff not a message " + uuid.uuid4().hex.encode()
    client.hset(messages_key(namespace, QUEUE), "garbled", body)
    client.rpush(queue_key(namespace, QUEUE), "garbled")
    _settled_pause(QUEUE)
    # A message whose actor name does not fit a dead letter's column: kept as text too, not left
    # held to fail every later purge.
    long_named = Message(queue_name=QUEUE, actor_name="a" * 300, args=(), kwargs={}, options={})
    client.hset(messages_key(namespace, QUEUE), "long", long_named.encode())
    client.rpush(queue_key(namespace, QUEUE), "long")
    # And one whose retries are not a count (another producer's message).
    odd = Message(queue_name=QUEUE, actor_name="odd", args=(), kwargs={}, options={"retries": "x"})
    client.hset(messages_key(namespace, QUEUE), "odd", odd.encode())
    client.rpush(queue_key(namespace, QUEUE), "odd")
    _settled_pause(QUEUE)
    assert purge_queue(QUEUE, by="ops").from_broker == 3
    letters = DeadLetter.objects.filter(queue=QUEUE)
    assert all(letter.message_id.startswith("unreadable-") for letter in letters)
    assert sorted(letter.payload["unreadable_body"][:14] for letter in letters) == [
        '{"queue_name":', '{"queue_name":', '\ufffd not a messag']


@pytest.mark.django_db(transaction=True)
@pytest.mark.empty_queues(QUEUE)
def test_a_purge_killed_midway_loses_nothing_and_the_next_one_records_each_message_once() -> None:
    broker = configured_broker()
    total = 12_000
    messages = [jobs.pause_run.message_with_options(kwargs={"key": f"k{n}", "hold_s": 0.0}) for n in range(total)]
    for start in range(0, total, 1_000):
        enqueue_many(broker, [(message, None) for message in messages[start:start + 1_000]])
    _settled_pause(QUEUE)
    purge = subprocess.Popen([sys.executable, "-m", "django", "queues", "purge", QUEUE, "--yes"], cwd=ROOT,
                             env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: DeadLetter.objects.filter(queue=QUEUE).count() >= 1_000 or purge.poll() is not None,
                   timeout_s=60)
        purge.send_signal(signal.SIGKILL)
    finally:
        purge.wait(timeout=30)
    recorded = DeadLetter.objects.filter(queue=QUEUE).count()
    assert 0 < recorded < total, f"not killed midway ({recorded} of {total} recorded)"

    result = purge_queue(QUEUE, by="ops")
    # The killed purge's held batch again (recorded once more, if it died between its COMMIT and release).
    assert total - recorded <= result.from_broker <= total - recorded + BATCH
    assert sorted(DeadLetter.objects.filter(queue=QUEUE).values_list("message_id", flat=True)) == sorted(
        message.message_id for message in messages)
    assert broker_counts(QUEUE, broker).ready == 0


def _purged_keys() -> list[str]:
    return [letter.payload["key"] for letter in DeadLetter.objects.filter(queue=QUEUE).order_by("id")]


@pytest.mark.django_db(transaction=True)
@pytest.mark.empty_queues(QUEUE)
def test_a_purge_records_a_key_s_messages_in_publish_order_so_a_replay_relays_them_so() -> None:
    _publish(["a1"], key="account-7")  # on the broker
    with left_to_the_relay():
        _publish(["a2", "a3"], key="account-7")  # behind it, in the outbox
    assert _unsent() == 2 and broker_counts(QUEUE, configured_broker()).ready == 1
    _settled_pause(QUEUE)
    purge_queue(QUEUE, by="ops")
    # A group is replayed in dead letter order (deadletters replay, the admin's action).
    assert _purged_keys() == ["a1", "a2", "a3"]
    resume_queue(QUEUE, by="ops")
    call_command("deadletters", "replay", "--error", "Purged", "--yes", stdout=io.StringIO())
    assert run_queued_jobs(QUEUE).count("success") == 3
    assert list(Effect.objects.order_by("id").values_list("key", flat=True)) == ["a1", "a2", "a3"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.empty_queues(QUEUE)
def test_a_purge_racing_a_relay_that_sends_a_key_s_head_records_the_key_in_publish_order() -> None:
    broker = configured_broker()
    with left_to_the_relay():
        _publish(["h1"], key="account-8")
    relay = Relay(broker, lease_s=30)
    claimed = relay.claim()  # the relay is sending the key's head when the purge starts
    assert [message.id for message in claimed] == list(OutboxMessage.objects.values_list("id", flat=True))
    with left_to_the_relay():
        _publish(["h2", "h3"], key="account-8")
    _settled_pause(QUEUE)

    def purging() -> None:
        try:
            purge_queue(QUEUE, by="ops")
        finally:
            connection.close()

    purge = threading.Thread(target=purging)
    purge.start()
    time.sleep(0.5)
    relay.send_claimed(claimed, since=time.monotonic())  # sent, marked sent: the purge takes it on the broker
    purge.join(timeout=60)
    assert not purge.is_alive() and _unsent() == 0 and broker_counts(QUEUE, broker).ready == 0
    assert _purged_keys() == ["h1", "h2", "h3"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.empty_queues(QUEUE)
def test_a_redis_purge_records_its_batches_in_queue_order() -> None:
    # Over 128 a Redis hash is a hash table, whose HGETALL order is not the order of its writes.
    keys = [f"q{n:03}" for n in range(300)]
    _publish(keys, key="account-9")
    assert broker_counts(QUEUE, configured_broker()).ready == 300
    _settled_pause(QUEUE)
    assert purge_queue(QUEUE, by="ops").from_broker == 300
    assert _purged_keys() == keys


@pytest.mark.django_db(transaction=True)
def test_a_purge_whose_broker_does_not_answer_says_so_in_one_line() -> None:
    with use_broker("redis://127.0.0.1:1/0") as broker:  # nothing listens there
        broker.declare_actor(jobs.pause_run)
        with pytest.raises(CommandError, match=r"the broker did not answer \(ConnectionError"):
            _run("purge", QUEUE)
        _settled_pause(QUEUE)
        with pytest.raises(CommandError, match=r"the broker did not answer .*: run it again once it answers"):
            _run("purge", QUEUE, "--yes")
