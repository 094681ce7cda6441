"""``django.tasks`` through the outbox (``composition.tasks.OutboxBackend``), against real PostgreSQL,
Redis and ``runworkers`` processes: a task enqueued in a rolled-back transaction never runs, a
committed one runs once, a failing one retries and becomes a dead letter, ``get_result`` follows
it all, and bad tasks, arguments and options are refused at once.

Runs on both matrix cells: Django 6's ``django.tasks`` and Django 5.2 with the backport.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import time
import uuid
from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import pytest

if not (importlib.util.find_spec("django.tasks") or importlib.util.find_spec("django_tasks")):
    pytest.skip("neither django.tasks (Django 6) nor the django-tasks backport is installed",
                allow_module_level=True)

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from dramatiq import Message
from dramatiq.broker import MessageProxy
from dramatiq.errors import ActorNotFound
from dramatiq.middleware import TimeLimitExceeded

from composition.broker.configured import configured_broker
from composition.errors import PermanentError
from composition.jobs.deadletters import record_dead_letter
from composition.jobs.models import DeadLetter, ProcessedMessage, TaskRecord
from composition.jobs.replay import replay
from composition.outbox import OutboxMessage, PayloadTooLargeError, publish
from composition.tasks import InvalidBackendOptions, InvalidTaskArguments, OutboxBackend, actor_name
from composition.tasks._compat import (
    BACKPORT,
    InvalidTask,
    InvalidTaskBackend,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
)
from composition.tasks.options import BackendOptions
from composition.tasks.setup import check_outbox_backends
from composition.testing import wait_until
from tests.jobsapp import jobs, tasks
from tests.jobsapp.models import Account, Attempt, Effect

# The whole file in the matrix cell too (Makefile): Django 6 ships django.tasks, 5.2 takes the backport.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.version_smoke,
    pytest.mark.django_db(transaction=True),
    pytest.mark.empty_queues(tasks.QUEUE, tasks.PLAIN_QUEUE),
]

THREADS = "4"
QUEUES = f"{tasks.QUEUE},{tasks.PLAIN_QUEUE}"


def status_of(task: Any, result_id: str) -> str:
    return str(task.get_result(result_id).status)


def outbox_row(result: Any) -> OutboxMessage:
    """The outbox row a task was enqueued with (its payload names the result)."""
    return OutboxMessage.objects.get(payload__result=result.id)


def running_pid(worker: Any) -> int:
    return int(worker.pid)


def not_a_task(n: int) -> None:
    """A module-level function that no test decorates at module level."""


# -- configuration -----------------------------------------------------------------------------------
def test_options_are_parsed_per_queue_and_bad_ones_name_the_setting() -> None:
    parsed = BackendOptions.parse("default", ["a", "b"], {
        "MAX_ATTEMPTS": 4, "TIMEOUT_S": 30, "QUEUE_OPTIONS": {"b": {"ATOMIC": False, "TIMEOUT_S": 5}}})
    assert (parsed.queues["a"].job.max_attempts, parsed.queues["a"].job.timeout_s, parsed.queues["a"].atomic) \
        == (4, 30.0, True)
    assert (parsed.queues["b"].job.max_attempts, parsed.queues["b"].job.timeout_s, parsed.queues["b"].atomic) \
        == (4, 5.0, False)
    defaults = BackendOptions.parse("default", ["default"], {}).queues["default"]
    assert (defaults.job.max_attempts, defaults.job.initial_delay_s, defaults.job.max_delay_s,
            defaults.job.timeout_s, defaults.atomic) == (5, 10.0, 900.0, 120.0, True)

    bad: list[tuple[dict[str, Any], str]] = [
        ({"QUEUES": []}, "QUEUES must name at least one queue"),
        ({"QUEUES": "emails"}, "QUEUES must be a list"),
        ({"QUEUES": ["bad queue"]}, "queue name 'bad queue' is not a Dramatiq queue name"),
        ({"OPTIONS": {"RETRIES": 3}}, "unknown key(s) ['RETRIES'] in OPTIONS"),
        ({"OPTIONS": {"MAX_ATTEMPTS": "3"}}, "MAX_ATTEMPTS of queue 'default' must be int, got '3'"),
        ({"OPTIONS": {"MAX_ATTEMPTS": True}}, "MAX_ATTEMPTS of queue 'default' must be int"),
        ({"OPTIONS": {"MAX_ATTEMPTS": 0}}, "max_attempts must be a whole number of at least 1"),
        ({"OPTIONS": {"TIMEOUT_S": -1}}, "timeout_s must be a number of seconds above 0"),
        ({"OPTIONS": {"ATOMIC": "yes"}}, "ATOMIC of queue 'default' must be bool"),
        ({"OPTIONS": {"QUEUE_OPTIONS": {"other": {}}}}, "names queues that are not in QUEUES: ['other']"),
        ({"OPTIONS": {"QUEUE_OPTIONS": {"default": {"QUEUE": "x"}}}},
         "unknown key(s) ['QUEUE'] in OPTIONS['QUEUE_OPTIONS']['default']"),
    ]
    for params, expected in bad:
        with pytest.raises(InvalidBackendOptions) as caught:
            OutboxBackend("default", {"BACKEND": "composition.tasks.OutboxBackend", **params})
        assert expected in str(caught.value), (params, str(caught.value))
        assert "TASKS['default']" in str(caught.value)
        # What django.tasks' own handler raises for a bad backend, and a configuration error.
        assert isinstance(caught.value, InvalidTaskBackend) and isinstance(caught.value, ImproperlyConfigured)


def test_building_the_backend_does_not_touch_the_broker() -> None:
    # @task builds the backend when a tasks module is imported: that must declare nothing.
    OutboxBackend("fresh", {"BACKEND": "composition.tasks.OutboxBackend", "QUEUES": ["jobs_tasks_fresh"]})
    with pytest.raises(ActorNotFound):
        configured_broker().get_actor(actor_name("fresh", "jobs_tasks_fresh"))


def test_the_system_check_reports_bad_options_and_the_backport_app() -> None:
    assert check_outbox_backends() == []
    broken = {"default": {"BACKEND": "composition.tasks.OutboxBackend", "OPTIONS": {"TIMEOUT": 3}}}
    with override_settings(TASKS=broken):
        assert [message.id for message in check_outbox_backends()] == ["composition.E090"]
    if BACKPORT:
        from django.conf import settings

        apps = [app for app in settings.INSTALLED_APPS if app != "django_tasks"]
        with override_settings(INSTALLED_APPS=apps):
            assert [message.id for message in check_outbox_backends()] == ["composition.W091"]


def test_the_workers_have_an_actor_per_queue_with_the_queue_policy() -> None:
    atomic = configured_broker().get_actor(actor_name("default", tasks.QUEUE))
    plain = configured_broker().get_actor(actor_name("default", tasks.PLAIN_QUEUE))
    assert (atomic.queue_name, atomic.options["max_retries"], atomic.options["job_policy"].idempotent) \
        == (tasks.QUEUE, 2, True)
    assert (plain.queue_name, plain.options["max_retries"], plain.options["job_policy"].idempotent) \
        == (tasks.PLAIN_QUEUE, 1, False)
    assert atomic.options["time_limit"] == 20_000


# -- refused at enqueue --------------------------------------------------------------------------------
def test_bad_tasks_and_arguments_are_refused_and_nothing_is_written() -> None:
    from composition.tasks._compat import Task

    refused_arguments = [
        (lambda: tasks.typed.enqueue(m=1), "unexpected keyword argument 'm'"),
        (lambda: tasks.typed.enqueue(), "missing a required argument 'n'"),
        (lambda: tasks.typed.enqueue(n="x"), "argument 'n' must be int, got str"),
        (lambda: tasks.typed.enqueue(1, tags="a"), "argument 'tags' must be list[str] | None, got str"),
        (lambda: tasks.typed.enqueue(1, 2, 3), "too many positional arguments"),
        (lambda: tasks.typed.enqueue(n=timezone.now()), "must be JSON values"),
        (lambda: tasks.typed.enqueue(1, tags=[{1: "a"}]), "argument 'tags' must be list[str] | None, got dict at "
                                                           "tags[0]"),
        (lambda: tasks.flaky.enqueue(key="k"), "missing a required argument 'fail_times'"),
        (lambda: tasks.typed.enqueue(1, tags=["a\x00b"]), "NUL character"),
        (lambda: tasks.typed.enqueue(1, tags=["\ud800"]), "lone surrogate"),
    ]
    for enqueue, expected in refused_arguments:
        with pytest.raises(InvalidTaskArguments) as caught:
            enqueue()
        assert expected in str(caught.value), str(caught.value)
        # Django's own backends raise TypeError for arguments they cannot take.
        assert isinstance(caught.value, TypeError) and isinstance(caught.value, InvalidTask)

    with pytest.raises(PayloadTooLargeError):
        tasks.typed.enqueue(1, tags=["x" * 10_000])

    from tests.jobsapp.tasks import task

    with pytest.raises(InvalidTask, match="Queue 'elsewhere' is not valid"):
        task(queue_name="elsewhere")(not_a_task)
    # Priorities are honoured on Redis; on RabbitMQ only with queues declared for them.
    assert task(queue_name=tasks.QUEUE, priority=5)(not_a_task).priority == 5
    amqp = "amqp://guest:guest@127.0.0.1:5672/%2F"
    with override_settings(COMPOSITION={**settings.COMPOSITION, "BROKER_URL": amqp}), \
            pytest.raises(InvalidTask, match="RABBITMQ_MAX_PRIORITY"):
        task(queue_name=tasks.QUEUE, priority=5)(not_a_task)
    with override_settings(COMPOSITION={**settings.COMPOSITION, "BROKER_URL": amqp, "RABBITMQ_MAX_PRIORITY": 10}):
        assert task(queue_name=tasks.QUEUE, priority=-100)(not_a_task).priority == -100
    # Quorum queues: no priorities here (RabbitMQ 3.x has none on them), so only 0.
    with override_settings(COMPOSITION={**settings.COMPOSITION, "BROKER_URL": amqp, "RABBITMQ_QUEUE_TYPE": "quorum"}):
        with pytest.raises(InvalidTask, match="quorum queues"):
            task(queue_name=tasks.QUEUE, priority=5)(not_a_task)
        assert task(queue_name=tasks.QUEUE, priority=0)(not_a_task).priority == 0
    with pytest.raises(InvalidTask, match="priority"):
        task(queue_name=tasks.QUEUE, priority=101)(not_a_task)
    # Decorated under another name: a worker could not find it by its module path.
    misnamed = task(queue_name=tasks.QUEUE)(not_a_task)
    assert isinstance(misnamed, Task)
    with pytest.raises(InvalidTask, match="not importable"):
        misnamed.enqueue(1)
    # A countdown as Celery takes it (an AttributeError from deep inside Django), a naive moment,
    # and one further than the outbox delays (its error named a delay_s nobody gave).
    for run_after, says in ((timedelta(seconds=5), "run_after must be an aware datetime"),
                            ("tomorrow", "run_after must be an aware datetime"),
                            (datetime(2030, 1, 1), "run_after must be an aware datetime"),
                            (timezone.now() + timedelta(days=365 * 20), "run_after is at most 10 years ahead")):
        with pytest.raises(InvalidTask, match=says):
            tasks.add_effect.using(run_after=run_after).enqueue("never")
    assert not OutboxMessage.objects.exists() and not TaskRecord.objects.exists()


def test_a_task_s_dead_letter_names_its_task_and_is_grouped_listed_and_selected_by_it(admin_client: Any) -> None:
    # One actor runs every task of the queue: before, two tasks failing alike were one group
    # under that actor, and nothing selected one task's letters.
    runner = task_backends["default"].actor(tasks.QUEUE)
    fails, refuses = tasks.always_fails.module_path, tasks.refuses.module_path

    def letter(path: str) -> DeadLetter:
        message = MessageProxy(Message(queue_name=tasks.QUEUE, actor_name=runner.actor_name, args=(), options={},
                                       kwargs={"task": path, "args": ["k"], "kwargs": {}, "result": str(uuid.uuid4())}))
        return DeadLetter.objects.get(pk=record_dead_letter(message, PermanentError("no account 41"), attempts=1))

    first, second, other = letter(fails), letter(fails), letter(refuses)
    assert (first.task_path, other.task_path, first.actor) == (fails, refuses, runner.actor_name)
    assert first.fingerprint == second.fingerprint != other.fingerprint

    listed = json.loads(call_command_output("deadletters", "list", "--task", fails, "--json"))
    assert (listed["count"], [group["task_path"] for group in listed["groups"]]) == (2, [fails])
    plain = call_command_output("deadletters", "list")
    assert f"{first.fingerprint[:12]}  {fails}" in plain and f"{other.fingerprint[:12]}  {refuses}" in plain
    assert "discarded 1 of 1" in call_command_output("deadletters", "discard", "--task", refuses, "--yes")
    assert [row.status for row in DeadLetter.objects.order_by("id")] == ["dead", "dead", "discarded"]
    # A path past the column (a mangled payload's) is cut to 1,024 bytes, not a lost letter: its
    # index refuses rows over 2,704 bytes, which 1,024 characters of non-ASCII text are.
    assert letter("é" * 2000).task_path == "é" * 512
    with pytest.raises(CommandError, match="--task is empty"):
        call_command_output("deadletters", "list", "--task", " ")

    page = admin_client.get("/admin/composition/deadletter/", {"task_path": fails})
    assert {row.pk for row in page.context["cl"].result_list} == {first.pk, second.pk}
    assert fails in page.content.decode() and "Actor or task" in page.content.decode()


def call_command_output(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_get_result_of_an_unknown_id_or_another_actors_row() -> None:
    for result_id in ("", "abc", "-1", "12345678", "1.0", str(uuid.uuid4())):
        with pytest.raises(TaskResultDoesNotExist):
            tasks.add_effect.get_result(result_id)
    job_row = publish(jobs.noop, {})
    configured_broker().flush(jobs.NOOP_QUEUE)
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add_effect.get_result(str(job_row.pk))


def test_the_result_of_a_task_a_deploy_removed_is_still_told() -> None:
    # A result enqueued by the deploy before, for a function this one no longer has: get_result
    # raised ImportError; it tells the state, with a stand-in under the same path.
    record = TaskRecord.objects.create(backend="default", queue_name=tasks.QUEUE,
                                       task_path="tests.jobsapp.tasks.renamed_since", args=[1],
                                       message_id="renamed-since-message")
    backend = task_backends["default"]
    result = backend.get_result(str(record.pk))
    assert (result.status, result.task.module_path, result.args) == (TaskResultStatus.READY,
                                                                     "tests.jobsapp.tasks.renamed_since", [1])
    with pytest.raises(InvalidTask, match="no longer a task"):
        result.task.call(1)
    # Parked by a worker that could not run it, before any run wrote to the record: FAILED.
    now = timezone.now()
    DeadLetter.objects.create(actor=actor_name("default", tasks.QUEUE), queue=tasks.QUEUE,
                              message_id=record.message_id, payload={}, attempts=1,
                              error_class="composition.errors.IncompatibleMessageError",
                              error_message="tests.jobsapp.tasks.renamed_since is not importable",
                              fingerprint="f" * 32, first_failed_at=now, last_failed_at=now)
    failed = backend.get_result(str(record.pk))
    assert failed.status == TaskResultStatus.FAILED and failed.finished_at == now
    assert [error.exception_class_path for error in failed.errors] == ["composition.errors.IncompatibleMessageError"]
    # Another backend's alias does not find it.
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(str(TaskRecord.objects.create(
            backend="other", queue_name=tasks.QUEUE, task_path="x.y").pk))


def test_a_running_record_whose_lease_ran_out_reads_ready_and_a_replayed_failure_reads_ready() -> None:
    record = TaskRecord.objects.create(backend="default", queue_name=tasks.QUEUE,
                                       task_path="tests.jobsapp.tasks.add_effect", args=["x"],
                                       status=TaskRecord.Status.RUNNING, message_id="lease-message",
                                       running_until=timezone.now() + timedelta(seconds=30))
    assert status_of(tasks.add_effect, str(record.pk)) == TaskResultStatus.RUNNING
    TaskRecord.objects.filter(pk=record.pk).update(running_until=timezone.now() - timedelta(seconds=1))
    assert status_of(tasks.add_effect, str(record.pk)) == TaskResultStatus.READY
    TaskRecord.objects.filter(pk=record.pk).update(status=TaskRecord.Status.FAILED, running_until=None,
                                                   finished_at=timezone.now())
    assert status_of(tasks.add_effect, str(record.pk)) == TaskResultStatus.FAILED
    now = timezone.now()
    DeadLetter.objects.create(actor=actor_name("default", tasks.QUEUE), queue=tasks.QUEUE,
                              message_id=record.message_id, payload={}, attempts=1, error_class="ValueError",
                              fingerprint="f" * 32, first_failed_at=now, last_failed_at=now,
                              status=DeadLetter.Status.REPLAYED)
    assert status_of(tasks.add_effect, str(record.pk)) == TaskResultStatus.READY


# -- real workers ----------------------------------------------------------------------------------------
def test_rolled_back_never_runs_and_committed_runs_once(worker_processes) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = tasks.add_effect.enqueue("rolled-back")
        assert TaskRecord.objects.filter(pk=rolled_back.id).exists() and outbox_row(rolled_back)
        raise RuntimeError("roll back")
    with transaction.atomic():
        committed = tasks.add_effect.enqueue("committed")
        plain = tasks.add_effect_plain.enqueue(key="plain")
        deferred = tasks.add_effect.using(run_after=timezone.now() + timedelta(seconds=1)).enqueue("deferred")
    assert committed.status == TaskResultStatus.READY and committed.enqueued_at is not None
    assert committed.args == ["committed"] and plain.kwargs == {"key": "plain"}
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add_effect.get_result(rolled_back.id)
    # Nothing runs it yet: it is sent (right after COMMIT) and waits in its queue.
    assert status_of(tasks.add_effect, committed.id) == TaskResultStatus.READY
    assert 0 < (outbox_row(deferred).delay_s or 0) <= 1

    worker = worker_processes.spawn(["--threads", THREADS, "--queues", QUEUES])
    wait_until(lambda: Effect.objects.filter(key__in=["committed", "plain", "deferred"]).count() == 3, timeout_s=60,
               message=f"tasks did not run; worker log:\n{worker.output()[-3000:]}")
    wait_until(lambda: all(status_of(tasks.add_effect, r.id) == TaskResultStatus.SUCCESSFUL
                           for r in (committed, deferred)), timeout_s=10)
    committed.refresh()
    assert committed.status == TaskResultStatus.SUCCESSFUL and committed.is_finished
    assert committed.finished_at is not None and committed.finished_at >= committed.enqueued_at
    # The run it reports: one attempt, by this worker, started before it finished.
    assert committed.worker_ids == [f"{socket.gethostname()}:{running_pid(worker)}"], committed.worker_ids
    assert committed.enqueued_at <= committed.started_at == committed.last_attempted_at <= committed.finished_at
    assert committed.return_value is None  # its function returns None
    plain_result = tasks.add_effect_plain.get_result(plain.id)  # ATOMIC False: recorded after the run
    assert plain_result.status == TaskResultStatus.SUCCESSFUL and plain_result.attempts == 1
    assert plain_result.return_value == "plain"
    assert plain_result.started_at is not None and plain_result.started_at <= plain_result.finished_at
    assert tasks.add_effect.get_result(deferred.id).task.run_after is not None
    assert worker.terminate() == 0

    # Once, and never the rolled-back one.
    assert Effect.objects.filter(key="committed").count() == 1
    assert Effect.objects.filter(key="plain").count() == 1
    assert not Effect.objects.filter(key="rolled-back").exists()
    assert ProcessedMessage.objects.filter(actor=actor_name("default", tasks.PLAIN_QUEUE)).count() == 1


def test_failures_retry_with_backoff_then_dead_letter_and_replay(worker_processes) -> None:
    failing = tasks.always_fails.enqueue("doomed")
    permanent = tasks.refuses.enqueue("never")
    flaky = tasks.flaky.enqueue(key="flaky", fail_times=2)
    missing = tasks.needs_account.enqueue("acct-1")
    worker = worker_processes.spawn(["--threads", THREADS, "--queues", QUEUES])

    def settled() -> bool:
        return DeadLetter.objects.count() == 3 and Effect.objects.filter(key__startswith="flaky:").exists()

    wait_until(settled, timeout_s=60, message=f"tasks did not settle; worker log:\n{worker.output()[-3000:]}")
    hostname = socket.gethostname()

    # A transient failure retries up to MAX_ATTEMPTS (3), then becomes a dead letter: FAILED.
    result = tasks.always_fails.get_result(failing.id)
    assert result.status == TaskResultStatus.FAILED and result.is_finished
    assert result.attempts == 3 and all(worker_id.startswith(f"{hostname}:") for worker_id in result.worker_ids)
    assert [error.exception_class for error in result.errors] == [ValueError]
    assert "doomed always fails" in result.errors[0].traceback
    # It ran: its first attempt began, then its last, before it failed for good.
    assert result.started_at is not None and result.last_attempted_at is not None
    assert result.enqueued_at <= result.started_at < result.last_attempted_at <= result.finished_at
    dead = DeadLetter.objects.get(message_id=outbox_row(failing).message_id)
    assert (dead.attempts, dead.actor, dead.payload["task"], dead.task_path) == (
        3, actor_name("default", tasks.QUEUE), "tests.jobsapp.tasks.always_fails", "tests.jobsapp.tasks.always_fails")
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value

    # A PermanentError is dead-lettered after one attempt.
    result = tasks.refuses.get_result(permanent.id)
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1
    assert result.errors[0].exception_class.__name__ == "PermanentError"

    # The context sees the attempt and the result id; the third attempt succeeded, once.
    assert list(Effect.objects.filter(key__startswith="flaky:").values_list("key", flat=True)) \
        == [f"flaky:attempt=3:id={flaky.id}"]
    assert tasks.flaky.get_result(flaky.id).status == TaskResultStatus.SUCCESSFUL

    # ATOMIC: False: each run committed on its own (two attempts, both failed).
    assert list(Attempt.objects.filter(key="acct-1").values_list("attempt", flat=True)) == [1, 2]
    assert tasks.needs_account.get_result(missing.id).status == TaskResultStatus.FAILED
    # Fix the data and replay: the same result id follows the replay to success.
    Account.objects.create(name="acct-1")
    replay(DeadLetter.objects.get(actor=actor_name("default", tasks.PLAIN_QUEUE)).pk)
    wait_until(lambda: status_of(tasks.needs_account, missing.id) == TaskResultStatus.SUCCESSFUL, timeout_s=30,
               message=f"the replay did not succeed; worker log:\n{worker.output()[-3000:]}")
    result = tasks.needs_account.get_result(missing.id)
    assert [error.exception_class for error in result.errors] == [LookupError]  # the history stays
    assert Effect.objects.filter(key="acct-1").count() == 1
    assert worker.terminate() == 0


def test_task_finished_listeners_run_after_the_tasks_transaction_and_cannot_change_its_error(
        worker_processes) -> None:
    # FAILED went out inside the task's own transaction: a listener's row was rolled back with
    # it, and after a database error the listener's query failed in the broken transaction,
    # its TransactionManagementError recorded in place of the task's IntegrityError.
    broken = tasks.duplicates_account.enqueue("dup")
    refused = tasks.refuses.enqueue("listened")
    succeeded = tasks.add_effect.enqueue("listened-ok")
    worker = worker_processes.spawn(["--threads", THREADS, "--queues", QUEUES])
    wait_until(lambda: Effect.objects.filter(key__startswith="finished:").count() == 3, timeout_s=60,
               message=f"listeners did not all run; worker log:\n{worker.output()[-3000:]}")
    assert sorted(Effect.objects.filter(key__startswith="finished:").values_list("key", flat=True)) == [
        "finished:add_effect:SUCCESSFUL", "finished:duplicates_account:FAILED", "finished:refuses:FAILED"]
    wait_until(lambda: DeadLetter.objects.count() == 2, timeout_s=30, message=worker.output()[-3000:])
    result = tasks.duplicates_account.get_result(broken.id)
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class_path for error in result.errors] == ["django.db.utils.IntegrityError"]
    assert DeadLetter.objects.get(message_id=outbox_row(broken).message_id).error_class \
        == "django.db.utils.IntegrityError"
    assert not Account.objects.filter(name="dup").exists()  # the task's own rows rolled back
    # The listener that raised for refuses: logged; the task's PermanentError is what was recorded.
    assert tasks.refuses.get_result(refused.id).errors[0].exception_class.__name__ == "PermanentError"
    assert "a task_finished listener raised" in worker.output()
    assert tasks.add_effect.get_result(succeeded.id).status == TaskResultStatus.SUCCESSFUL
    assert worker.terminate() == 0


def test_a_replayed_task_runs_under_its_result_id_with_its_attempts_counted_on(worker_processes) -> None:
    # The replay ran with the replay's own outbox id as its result id and counted attempts from 1;
    # it runs under the caller's result id, its attempts counted on.
    result = tasks.needs_account_in_context.enqueue("acct-ctx")
    worker = worker_processes.spawn(["--threads", THREADS, "--queues", QUEUES])
    wait_until(lambda: DeadLetter.objects.exists(), timeout_s=60, message=worker.output()[-3000:])
    failed = tasks.needs_account_in_context.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED and failed.attempts == 3
    Account.objects.create(name="acct-ctx")
    replay(DeadLetter.objects.get().pk)
    wait_until(lambda: Effect.objects.filter(key__startswith="acct-ctx:").exists(), timeout_s=30,
               message=worker.output()[-3000:])
    assert list(Effect.objects.values_list("key", flat=True)) == [f"acct-ctx:attempt=4:id={result.id}"]
    succeeded = tasks.needs_account_in_context.get_result(result.id)
    # Every attempt, the three before the replay and the one that succeeded.
    assert succeeded.status == TaskResultStatus.SUCCESSFUL and succeeded.attempts == 4, succeeded.worker_ids
    assert worker.terminate() == 0


def test_a_task_over_its_time_limit_is_interrupted_and_ends_failed_as_a_dead_letter(worker_processes) -> None:
    # The worker's settings give the queue a 1 s TIMEOUT_S and 2 attempts; the body would take 60 s.
    run_s = 60
    result = tasks.overruns.enqueue(key="overrun", run_s=run_s)
    message_id = outbox_row(result).message_id
    began = time.monotonic()
    worker = worker_processes.spawn(["--threads", THREADS, "--queues", QUEUES],
                                    DJANGO_SETTINGS_MODULE="tests.jobsapp.settings_task_time_limit")
    wait_until(lambda: DeadLetter.objects.filter(message_id=message_id).exists(), timeout_s=run_s / 2,
               message=f"no dead letter; worker log:\n{worker.output()[-3000:]}")
    assert time.monotonic() - began < run_s / 2
    dead = DeadLetter.objects.get(message_id=message_id)
    assert (dead.error_class, dead.attempts) == (f"{TimeLimitExceeded.__module__}.TimeLimitExceeded", 2)
    result = tasks.overruns.get_result(result.id)
    assert result.status == TaskResultStatus.FAILED and result.is_finished and result.attempts == 2
    assert [error.exception_class for error in result.errors] == [TimeLimitExceeded]
    # ATOMIC: each interrupted run rolled back, ledger row included.
    assert not Effect.objects.filter(key="overrun").exists()
    assert not ProcessedMessage.objects.filter(message_id=message_id).exists()
    assert worker.terminate() == 0


def test_get_result_reports_a_running_task_from_its_record(worker_processes) -> None:
    # RUNNING came from the heartbeats: up to WORKER_HEARTBEAT_S late. It is written as the run
    # starts, and the heartbeat is slow here on purpose (60 s).
    result = tasks.blocks_until_released.enqueue("slow")
    worker = worker_processes.spawn(["--threads", THREADS, "--queues", QUEUES],
                                    COMPOSITION_TEST_OVERRIDES=json.dumps({"WORKER_HEARTBEAT_S": 60}))
    wait_until(lambda: status_of(tasks.blocks_until_released, result.id) == TaskResultStatus.RUNNING,
               timeout_s=60, message=f"never seen running; worker log:\n{worker.output()[-3000:]}")
    running = tasks.blocks_until_released.get_result(result.id)
    assert running.started_at is not None and running.worker_ids == [f"{socket.gethostname()}:{running_pid(worker)}"]
    assert not running.is_finished
    Account.objects.create(name="release-slow")
    wait_until(lambda: status_of(tasks.blocks_until_released, result.id) == TaskResultStatus.SUCCESSFUL,
               timeout_s=30, message=f"never finished; worker log:\n{worker.output()[-3000:]}")
    assert Effect.objects.filter(key="slow").count() == 1
    assert worker.terminate() == 0




def test_the_default_alias_is_the_configured_backend() -> None:
    assert isinstance(task_backends["default"], OutboxBackend)
    assert task_backends["default"].supports_get_result and task_backends["default"].supports_defer


def test_coroutine_tasks_run_once_inside_their_ledger_s_transaction_retry_and_keep_the_time_limit(
        worker_processes) -> None:  # type: ignore[no-untyped-def]
    """A module of async tasks imports (one used to break every task in its module), and they
    run as sync ones do: ATOMIC (the ledger row and the effects in one transaction, a failed
    attempt rolled back), retried, and cut at the queue's time limit; aenqueue/aget_result work."""
    from asgiref.sync import async_to_sync

    done = async_to_sync(tasks.add_effect_async.aenqueue)("async-done")
    flaky = tasks.flaky_async.enqueue(key="async-flaky", fail_times=1)
    over = tasks.overruns_async.enqueue(key="async-over", run_s=30)
    worker = worker_processes.spawn(["--threads", THREADS, "--queues", QUEUES],
                                    DJANGO_SETTINGS_MODULE="tests.jobsapp.settings_task_time_limit")
    wait_until(lambda: async_to_sync(tasks.add_effect_async.aget_result)(done.id).status
               == TaskResultStatus.SUCCESSFUL, timeout_s=30, message=f"log:\n{worker.output()[-3000:]}")
    wait_until(lambda: status_of(tasks.flaky_async, flaky.id) == TaskResultStatus.SUCCESSFUL, timeout_s=30)
    over_id = outbox_row(over).message_id
    wait_until(lambda: DeadLetter.objects.filter(message_id=over_id).exists(), timeout_s=15,
               message=f"the overrun was not cut at its 1 s limit; log:\n{worker.output()[-3000:]}")
    assert list(Effect.objects.filter(key__startswith="async-").order_by("key").values_list("key", flat=True)) == [
        "async-done", "async-flaky:attempt=2", "async-flaky:tried=2"], "the failed attempt rolled back, once each"
    dead = DeadLetter.objects.get(message_id=over_id)
    assert (dead.error_class, dead.attempts) == (f"{TimeLimitExceeded.__module__}.TimeLimitExceeded", 2)
    assert tasks.flaky_async.get_result(flaky.id).attempts == 2
    assert not ProcessedMessage.objects.filter(message_id=over_id).exists()
    assert worker.terminate() == 0


def test_a_return_value_is_kept_as_json_and_one_that_cannot_be_fails_the_run_rolling_it_back(
        worker_processes) -> None:  # type: ignore[no-untyped-def]
    from composition.conf import conf

    kept = tasks.returns.enqueue("kept")
    too_large = tasks.returns.enqueue("too large", padding=int(conf.TASK_RETURN_VALUE_MAX_BYTES))
    not_json = tasks.returns.enqueue("a set")
    worker = worker_processes.spawn(["--threads", THREADS, "--queues", QUEUES])
    wait_until(lambda: status_of(tasks.returns, kept.id) == TaskResultStatus.SUCCESSFUL
               and DeadLetter.objects.count() == 2, timeout_s=30, message=f"log:\n{worker.output()[-3000:]}")
    kept.refresh()
    assert kept.return_value == {"key": "kept", "padding": "", "pair": [1, 2]}  # a tuple comes back a list
    for refused, says in ((too_large, "over TASK_RETURN_VALUE_MAX_BYTES"), (not_json, "returned set")):
        result = tasks.returns.get_result(refused.id)
        assert result.status == TaskResultStatus.FAILED and result.attempts == 1, "not retried"
        assert result.errors[0].exception_class.__name__ == "InvalidTaskReturnValue"
        dead = DeadLetter.objects.get(message_id=outbox_row(refused).message_id)
        assert says in dead.error_message, dead.error_message
    # ATOMIC: the failed runs' effects rolled back with them.
    assert list(Effect.objects.filter(key__in=["kept", "too large", "a set"]).values_list("key", flat=True)) == ["kept"]
    assert worker.terminate() == 0
