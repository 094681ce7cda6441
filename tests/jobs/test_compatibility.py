"""``manage.py jobs check-compat`` against the test database and broker: queued work that the
running code would refuse is reported per job and problem with its count and an example id,
grouped by shape (one bind per distinct shape), and the command exits 1; work that fits is not
reported, and with none of the other kind it exits 0. The ten code changes of the deploy issue
run the command as a deploy would: a child process on the new code (``COMPAT_CODE``)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import uuid
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from dramatiq.message import Message

from composition.broker.configured import configured_broker
from composition.jobs.broker_compatibility import broker_problems
from composition.jobs.compatibility import GONE, queued_problems
from composition.jobs.models import DeadLetter
from composition.outbox.models import OutboxMessage
from composition.pauses import Pause
from composition.testing import free_port, subprocess_env
from tests.helpers import RABBITMQ_URL, ROOT
from tests.jobsapp import jobs
from tests.jobsapp import tasks as jobs_tasks
from tests.jobsapp.compat_work import clear_compat_work, expected_problems, matched, queue_compat_work
from tests.jobsapp.deploys import BREAKING, COMPAT_CODES, COMPAT_QUEUE

# Messages per source (outbox, dead letters, broker) in the gate; bench_check_compat.py writes 100,000.
PER_SOURCE = 400

pytestmark = [pytest.mark.django_db, pytest.mark.empty_queues()]


def _pending(actor: str, payload: dict[str, object], count: int = 1) -> list[int]:
    declared = configured_broker().actors.get(actor)  # on its job's queue, as publish() writes it
    queue = declared.queue_name if declared is not None else jobs.PAUSE_QUEUE
    rows = OutboxMessage.objects.bulk_create(OutboxMessage(actor_name=actor, queue_name=queue, payload=payload)
                                             for _ in range(count))
    return [row.pk for row in rows]


def _dead_letter(actor: str, args: list[object], payload: dict[str, object], *,
                 status: str = DeadLetter.Status.DEAD) -> int:
    now = timezone.now()
    return DeadLetter.objects.create(actor=actor, queue=jobs.PAUSE_QUEUE, message_id=uuid.uuid4().hex, args=args,
                                     payload=payload, attempts=1, error_class="PermanentError", fingerprint="f",
                                     first_failed_at=now, last_failed_at=now, status=status).pk


def _check(*extra: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("jobs", "check-compat", *extra, stdout=out)
    except SystemExit as exit_:
        return int(exit_.code or 0), out.getvalue()
    return 0, out.getvalue()


def test_work_the_running_code_would_refuse_is_counted_per_job_and_problem_and_exits_1() -> None:
    _pending("pause_effect", {"key": "fits", "hold_s": 1.0}, count=3)
    _pending("pause_effect", {"hold_s": 1.5, "key": "fits in another order"})
    missing = _pending("pause_effect", {"key": "no hold"}, count=2)
    unexpected = _pending("pause_effect", {"key": "x", "hold_s": 1.0, "colour": "red"}, count=4)
    wrong_type = _pending("pause_effect", {"key": 5, "hold_s": 1.0})
    gone = _pending("a_job_since_removed", {"invoice_id": 1}, count=2)
    dead_gone = _dead_letter("a_job_since_removed", [], {"invoice_id": 2})
    _dead_letter("a_job_since_removed", [], {"invoice_id": 3}, status=DeadLetter.Status.REPLAYED)
    _dead_letter("pause_effect", ["positional", 2.0], {})  # positional arguments that fit

    with CaptureQueriesContext(connection) as queries:
        problems = queued_problems(configured_broker())
    # A grouped query and one reading an example of each shape, per source.
    assert len(queries) == 2 + 2, [query["sql"][:80] for query in queries]
    found = {(p.source, p.actor, p.count, p.example_id): p.reason for p in problems}
    assert set(found) == {("outbox", "pause_effect", 4, unexpected[0]), ("outbox", "pause_effect", 2, missing[0]),
                          ("outbox", "a_job_since_removed", 2, gone[0]), ("outbox", "pause_effect", 1, wrong_type[0]),
                          ("dead letters", "a_job_since_removed", 1, dead_gone)}
    assert "unexpected keyword argument 'colour'" in found[("outbox", "pause_effect", 4, unexpected[0])]
    assert "missing a required argument 'hold_s'" in found[("outbox", "pause_effect", 2, missing[0])]
    assert "argument 'key' must be str, got int" in found[("outbox", "pause_effect", 1, wrong_type[0])]
    assert found[("outbox", "a_job_since_removed", 2, gone[0])] == GONE

    code, out = _check()
    assert code == 1
    assert f"outbox: 4 of pause_effect (e.g. id {unexpected[0]}): " in out
    assert f"dead letters: 1 of a_job_since_removed (e.g. id {dead_gone}): {GONE}" in out
    code, out = _check("--json")
    assert code == 1 and len(json.loads(out)["problems"]) == 5


def test_with_only_work_that_fits_it_says_so_and_exits_0() -> None:
    _pending("pause_effect", {"key": "fits", "hold_s": 1.0}, count=2)
    _pending("pause_effect", {"key": "sent already", "hold_s": "not a number"})
    OutboxMessage.objects.filter(payload__key="sent already").update(status=OutboxMessage.Status.SENT)
    code, out = _check()
    assert code == 0, out
    assert out.startswith("every queued message fits the running code\nread 0 messages on the broker"), out


def test_the_redis_broker_s_ready_and_delayed_messages_are_read_and_bound() -> None:
    broker = configured_broker()
    bad = Message(queue_name=COMPAT_QUEUE, actor_name="compat_job", args=(), kwargs={"invoice_id": "7"}, options={})
    gone = Message(queue_name=COMPAT_QUEUE, actor_name="a_job_since_removed", args=(), kwargs={}, options={})
    fine = Message(queue_name=COMPAT_QUEUE, actor_name="compat_job", args=(), kwargs={"invoice_id": 7}, options={})
    newer = Message(queue_name=COMPAT_QUEUE, actor_name="compat_job", args=(), kwargs={"invoice_id": 7},
                    options={"composition": {"job_version": 3}})
    for message, delay_ms in [(bad, None), (bad, None), (bad, 60_000), (gone, 60_000), (fine, None), (fine, 60_000),
                              (newer, None)]:
        broker.enqueue(message.copy(message_id=uuid.uuid4().hex), delay=delay_ms)
    report = broker_problems(broker, sent_since=timezone.now())
    assert report.messages_read == 7 and report.queue_counts is None
    found = {(p.source, p.actor, p.count): p.reason for p in report.problems}
    assert set(found) == {("broker", "compat_job", 3), ("broker", "a_job_since_removed", 1),
                          ("broker", "compat_job", 1)}
    assert "argument 'invoice_id' must be int, got str" in found[("broker", "compat_job", 3)]
    assert found[("broker", "a_job_since_removed", 1)] == GONE
    assert "published at version 3, newer than this code's 1" in found[("broker", "compat_job", 1)]
    code, out = _check()
    assert code == 1 and "broker: 3 of compat_job (e.g. id " in out and "read 7 messages on the broker" in out


def test_a_job_moved_to_another_queue_strands_its_broker_messages_and_the_relay_s_nudges_are_not_jobs() -> None:
    from composition.outbox.relay import RELAY_ACTOR_NAME, RELAY_QUEUE_NAME

    broker = configured_broker()
    for queue in ("jobs_compat_before_the_move", RELAY_QUEUE_NAME):
        broker.declare_queue(queue)
    # Sent by the code of a deploy ago, when compat_job ran on another queue: no worker of this
    # code reads that one (Dramatiq consumes declared queues only). Two ready, one delayed.
    moved = Message(queue_name="jobs_compat_before_the_move", actor_name="compat_job", args=(),
                    kwargs={"invoice_id": 7}, options={})
    for delay_ms in (None, None, 60_000):
        broker.enqueue(moved.copy(message_id=uuid.uuid4().hex), delay=delay_ms)
    # The outbox relay's nudges wait on its queue while no worker reads it (during a deploy, or
    # behind a keyed row): the library's own, declared lazily by the process that relays.
    for _ in range(2):
        broker.enqueue(Message(queue_name=RELAY_QUEUE_NAME, actor_name=RELAY_ACTOR_NAME, args=(), kwargs={},
                               options={}, message_id=uuid.uuid4().hex))
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "jobs", "check-compat", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.settings"))
    assert done.returncode == 1, done.stderr
    [problem] = json.loads(done.stdout)["problems"]
    assert (problem["source"], problem["actor"], problem["count"]) == ("broker", "compat_job", 3)
    assert problem["reason"].startswith(
        f"waits on queue 'jobs_compat_before_the_move', but the job now runs on '{COMPAT_QUEUE}'"), problem


def test_a_broker_message_that_is_not_json_is_reported_by_its_id() -> None:
    from composition.broker.keys import messages_key

    broker = configured_broker()
    broker.declare_queue(COMPAT_QUEUE)
    garbled = f"garbled-{uuid.uuid4().hex}"
    broker.client.hset(messages_key(broker.namespace, COMPAT_QUEUE), garbled, b"\x00not json")
    [problem] = broker_problems(broker, sent_since=timezone.now()).problems
    assert (problem.actor, problem.reason, problem.count) == ("(unreadable)", "not a Dramatiq message", 1)
    assert problem.example_id == garbled, "the operator needs the id to find and remove it"


def test_a_task_row_is_bound_to_its_task_path_and_arguments() -> None:
    from composition.tasks.options import actor_name

    actor = actor_name("default", jobs_tasks.QUEUE)
    good = {"task": "tests.jobsapp.tasks.add_effect", "args": ["k"], "kwargs": {}}
    _pending(actor, good)
    missing = _pending(actor, {"task": "tests.jobsapp.tasks.no_such_task", "args": [], "kwargs": {}}, count=2)
    problems = queued_problems(configured_broker())
    assert [(p.actor, p.count, p.example_id) for p in problems] == [(actor, 2, missing[0])], problems
    assert "tests.jobsapp.tasks.no_such_task" in problems[0].reason


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_ten_code_changes_in_turn_report_every_breaking_one_with_its_counts_and_no_safe_one() -> None:
    written = queue_compat_work(PER_SOURCE)
    try:
        for code in COMPAT_CODES[1:]:
            done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "jobs", "check-compat", "--json"],
                                  cwd=ROOT, capture_output=True, text=True, timeout=120,
                                  env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.settings", COMPAT_CODE=code))
            report = json.loads(done.stdout)
            expected = expected_problems(code, written)
            assert matched(report["problems"], expected) == expected, (code, report["problems"])
            assert done.returncode == (1 if code in BREAKING else 0), (code, done.stderr)
            assert report["broker_messages_read"] == PER_SOURCE, code
    finally:
        clear_compat_work()


@pytest.mark.rabbitmq
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.empty_queues(COMPAT_QUEUE, rabbitmq=True)
def test_on_rabbitmq_the_rows_sent_within_the_retry_horizon_stand_for_the_broker_and_each_queue_is_counted() -> None:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    waiting = RabbitmqBroker(url=RABBITMQ_URL, middleware=[])
    waiting.declare_queue(COMPAT_QUEUE)
    for invoice_id in range(3):  # no consumer runs: they wait on the queue
        waiting.enqueue(Message(queue_name=COMPAT_QUEUE, actor_name="compat_job", args=(),
                                kwargs={"invoice_id": invoice_id}, options={}))
    waiting.close()
    pending = _pending("compat_job", {"invoice_id": 1}, count=2)
    sent = _pending("compat_job", {"invoice_id": 2}, count=3)
    long_ago = _pending("compat_job", {"invoice_id": 3})
    due_later = _pending("compat_job", {"invoice_id": 4})  # sent long ago with a delay: still waiting
    OutboxMessage.objects.filter(pk__in=sent).update(status=OutboxMessage.Status.SENT, sent_at=timezone.now())
    OutboxMessage.objects.filter(pk__in=long_ago + due_later).update(status=OutboxMessage.Status.SENT,
                                                                     sent_at=timezone.now() - timedelta(days=30))
    OutboxMessage.objects.filter(pk__in=due_later).update(delay_s=timedelta(days=40).total_seconds())
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "jobs", "check-compat", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.settings", COMPAT_CODE="add_required",
                                             BROKER_URL=RABBITMQ_URL))
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    found = {(p["source"], p["actor"], p["count"], p["example_id"]) for p in report["problems"]}
    assert found == {("outbox", "compat_job", 2, pending[0]), ("outbox, sent (may have run)", "compat_job", 4, sent[0])}
    assert all("missing a required argument 'currency'" in p["reason"] for p in report["problems"])
    assert report["queue_counts"][COMPAT_QUEUE] == 3 and report["broker_messages_read"] == 0
    # The text says what it could not read.
    text = subprocess.run([sys.executable, str(ROOT / "manage.py"), "jobs", "check-compat"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.settings", BROKER_URL=RABBITMQ_URL))
    assert "RabbitMQ cannot be read without side effects" in text.stdout and f"{COMPAT_QUEUE} 3" in text.stdout
    # A queue paused for 31 days holds its messages that long: the row sent 30 days ago counts too.
    Pause.objects.create(kind=Pause.QUEUE, name=COMPAT_QUEUE, changed_by="test", changed_at=timezone.now(),
                         paused_at=timezone.now() - timedelta(days=31))
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "jobs", "check-compat", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.settings", COMPAT_CODE="add_required",
                                             BROKER_URL=RABBITMQ_URL))
    assert done.returncode == 1, done.stderr
    found = {(p["source"], p["count"]) for p in json.loads(done.stdout)["problems"]}
    assert found == {("outbox", 2), ("outbox, sent (may have run)", 5)}


def test_a_schedule_whose_payload_the_code_refuses_is_reported_with_its_name() -> None:
    from datetime import timedelta as every

    from composition.schedules import schedule
    from composition.schedules.declaration import forget

    name = f"compat-{uuid.uuid4().hex[:8]}"
    schedule(jobs.typed, every=every(hours=1), payload={"invoice_id": "not an int"}, name=name)
    try:
        code, out = _check()
    finally:
        forget(name)
    assert code == 1
    assert f"schedules: 1 of typed (e.g. id {name}): the payload does not fit typed" in out, out


@pytest.mark.slow
def test_a_broker_that_does_not_answer_is_an_error_not_a_clean_report() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "jobs", "check-compat"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.settings",
                                             BROKER_URL=f"redis://127.0.0.1:{free_port()}/0"))
    assert done.returncode == 1 and "every queued message fits" not in done.stdout
    assert "could not read the broker" in done.stderr and "nothing was checked there" in done.stderr, done.stderr


def test_a_whole_number_and_a_fraction_are_shapes_apart_as_an_int_argument_tells_them() -> None:
    _pending("typed", {"invoice_id": 7})  # the lowest id: it would be the example of a shared shape
    fractions = _pending("typed", {"invoice_id": 7.5}, count=2)
    problems = queued_problems(configured_broker())
    assert [(p.actor, p.count, p.example_id) for p in problems] == [("typed", 2, fractions[0])]
    assert "argument 'invoice_id' must be int, got float" in problems[0].reason
