"""The workers' side: one ``@job`` actor per backend alias and queue runs the tasks sent to it.

The actor imports each task by the module path in its payload, marks its result RUNNING
(``composition.tasks.records``), and runs it with the jobs' policy. ``ATOMIC`` (the default) runs the task in one
transaction with its inbox ledger row and its SUCCESSFUL result; with ``ATOMIC: False`` it runs in
autocommit and both are written after, so a worker dying between the two runs it again.
``task_finished`` is sent once the run's transaction has ended, so a listener's queries are never
rolled back with it.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from functools import partial
from typing import Any

import structlog
from django.db import transaction
from django.utils import timezone
from dramatiq import Actor
from dramatiq.broker import MessageProxy
from dramatiq.middleware import Shutdown

from composition.broker.configured import configured_broker
from composition.broker.priorities import message_priority
from composition.broker.time_limits import INTERRUPTS, disarm_time_limit
from composition.errors import IncompatibleMessageError, PermanentError, described
from composition.jobs import current_message, job
from composition.jobs.compatibility import PAYLOAD_CHECK_OPTION
from composition.jobs.current import attempt_of
from composition.jobs.deadletters import TASK_PATH_OPTION
from composition.jobs.decorator import run_idempotently
from composition.jobs.deploy_window import refuse
from composition.jobs.inbox import ledger_key, record_processed
from composition.jobs.replay import RESOLVED_HOOK_OPTION
from composition.tasks._compat import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
)
from composition.tasks.calls import call, kept_value
from composition.tasks.leases import running_records
from composition.tasks.listeners import announce_finished, announce_started, error_dict, running_result, task_error
from composition.tasks.options import QueuePolicy, actor_name
from composition.tasks.payload import fitting_task
from composition.tasks.records import (
    dead_letter_resolved,
    mark_ended,
    mark_failed,
    mark_running,
    mark_succeeded,
)

__all__ = ["declare_task_actor", "worker_id"]

log = structlog.get_logger("composition.tasks")

_declare_lock = threading.Lock()


def worker_id() -> str:
    """This process's worker id, as its heartbeat names it (``host:pid``)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def declare_task_actor(alias: str, queue: str, policy: QueuePolicy) -> Actor[..., None]:
    """The actor running backend ``alias``'s tasks on ``queue``, declared on the configured broker
    on the first call (with ``policy``) and reused after. Declaring does not touch the broker."""
    broker = configured_broker()
    name = actor_name(alias, queue)
    with _declare_lock:
        # The registry, not get_actor(): a worker's broker answers unknown names with a stand-in.
        actor: Actor[..., None] | None = broker.actors.get(name)
        if actor is not None:
            return actor

        def run_task(task: str, args: list, kwargs: dict, result: str | None = None) -> None:
            message = current_message()
            # Called from another job's body, the message is that job's, not this task's.
            own = message if message is not None and message.actor_name == name else None
            _run_task(TaskRun(alias, queue, policy, name, task, args, kwargs, result, own))

        # The ledger transaction is run_task's own (run_idempotently), so that FAILED goes out
        # after it; the policy on the actor, which operators' tools read, still says idempotent.
        declare = job(queue=queue, max_attempts=policy.job.max_attempts, initial_delay_s=policy.job.initial_delay_s,
                      max_delay_s=policy.job.max_delay_s, timeout_s=policy.job.timeout_s,
                      idempotent=False, actor_name=name)
        declared = declare(run_task)
        declared.options["job_policy"] = dataclasses.replace(declared.options["job_policy"], idempotent=policy.atomic)
        # jobs check-compat binds queued tasks as the worker will (fitting_task).
        declared.options[PAYLOAD_CHECK_OPTION] = partial(_check_payload, alias, queue)
        # A replayed or discarded dead letter tells the task's result.
        declared.options[RESOLVED_HOOK_OPTION] = dead_letter_resolved
        # Its dead letters name their task: the actor runs every task of the queue.
        declared.options[TASK_PATH_OPTION] = _task_path
        return declared


def _task_path(payload: dict[str, Any]) -> str:
    path = payload.get("task")
    return path if isinstance(path, str) else ""


def _check_payload(alias: str, queue: str, args: Any, kwargs: Any) -> None:
    fitting_task(kwargs.get("task"), kwargs.get("args"), kwargs.get("kwargs"), alias=alias, queue=queue)


@dataclasses.dataclass
class TaskRun:
    """One run of a task message: what it names, and what the run has learnt so far."""

    alias: str
    queue: str
    policy: QueuePolicy
    actor: str
    path: str
    args: list[Any]
    kwargs: dict[str, Any]
    record_id: str | None  # the result's id (None: a message from before results were kept)
    message: MessageProxy | None  # None: called in-process, not by a worker
    outcome: str | None = None  # "succeeded", or "skipped" (a duplicate of a run that did)
    failure: TaskError | None = None  # the error that ended the task for good


def _run_task(run: TaskRun) -> None:
    message = run.message
    try:
        # Checked at enqueue; again here, because this worker may run another deploy.
        task = fitting_task(run.path, run.args, run.kwargs, alias=run.alias, queue=run.queue,
                            priority=message_priority(message.options) if message is not None else None)
    except IncompatibleMessageError as exc:
        if message is None:
            raise
        try:
            refuse(configured_broker(), message, exc)
        except IncompatibleMessageError as parked:
            # Its deploy window is over: parked as a dead letter, the task has failed.
            run.failure = task_error(parked)
            _record_end(run)
            raise
    start = None
    record_id = run.record_id if message is not None else None
    if record_id is not None and message is not None:
        try:
            start = mark_running(record_id, alias=run.alias, queue=run.queue, path=run.path, args=run.args,
                                 kwargs=run.kwargs, worker=worker_id(), message_id=message.message_id)
        except Exception as exc:
            log.warning("could not mark a task's result RUNNING", result_id=run.record_id, error=described(exc))
        else:
            if start is None:
                log.info("task already succeeded, skipped", task=run.path)
                return
    result = running_result(task, record_id=run.record_id, alias=run.alias, args=run.args, kwargs=run.kwargs,
                            worker=worker_id(), start=start)
    if start is not None and record_id is not None:
        running_records.add(record_id)
    try:
        announce_started(task, result)
        if run.policy.atomic and message is not None:
            run_idempotently(run.actor, message, _run, (task, run, result), {})
            if run.outcome is None:
                # The ledger had it: it succeeded before, and its result was lost (pruned early).
                _skipped(run)
        else:
            _run(task, run, result)
    except BaseException:
        if run.outcome == "succeeded":
            run.outcome = None  # recorded in a transaction that did not commit
        raise
    finally:
        if start is not None and record_id is not None:
            running_records.discard(record_id)
        if record_id is not None and run.outcome is None:
            _record_end(run)
        if run.failure is not None:
            result.errors.append(run.failure)
            announce_finished(result, TaskResultStatus.FAILED)
    if run.outcome == "succeeded":
        # After COMMIT of an atomic run (at once otherwise): only then has the task succeeded.
        transaction.on_commit(partial(announce_finished, result, TaskResultStatus.SUCCESSFUL), robust=True)


def _run(task: Task[Any, Any], run: TaskRun, result: TaskResult[Any, Any]) -> None:
    """Run the task and, in the same transaction for an atomic run, record its success; a run
    that fails for good sets ``run.failure`` for the caller to record and announce once the
    transaction is over."""
    message = run.message
    if not run.policy.atomic and message is not None and _ledger(message).exists():
        log.info("task already ran, skipped", task=run.path)
        _skipped(run)
        return
    try:
        returned = kept_value(run.path, call(task, [TaskContext(task_result=result), *run.args]
                                         if task.takes_context else run.args, run.kwargs,
                                         timeout_s=run.policy.job.timeout_s))
    except BaseException as exc:
        if message is None or _is_final(exc, message, run.policy):
            run.failure = task_error(exc)
        raise
    if message is not None and not run.policy.atomic:
        try:
            disarm_time_limit()  # the run is over: an interrupt now would only repeat it
        except INTERRUPTS:
            pass  # landed as the disarm began
        with transaction.atomic():
            if record_processed(ledger_key(message), message.actor_name):
                _succeeded(run, returned)
            else:
                _skipped(run)
    else:
        # Atomic: in the ledger's transaction, so SUCCESSFUL commits with the effects.
        _succeeded(run, returned)
    object.__setattr__(result, "_return_value", returned)


def _succeeded(run: TaskRun, returned: Any) -> None:
    run.outcome = "succeeded"
    if run.record_id is not None and run.message is not None:
        mark_succeeded(run.record_id, return_value=returned, finished_at=timezone.now())


def _skipped(run: TaskRun) -> None:
    """A duplicate of a run that succeeded: its record says so again (if it had been lost and this
    run's RUNNING write made it anew), without a return value, which only that run knew."""
    run.outcome = "skipped"
    if run.record_id is not None and run.message is not None:
        try:
            mark_succeeded(run.record_id, return_value=None, finished_at=timezone.now(), keep_value=True)
        except Exception as exc:
            log.warning("could not write a task's result", result_id=run.record_id, error=described(exc))


def _record_end(run: TaskRun) -> None:
    """After a run that did not succeed, and after its rollback: FAILED for good, else READY for
    the retry or redelivery that follows. A write that fails is logged: the result then tells
    what its lease and its dead letter say."""
    try:
        disarm_time_limit()  # the run is over; these writes must not be interrupted
    except INTERRUPTS:
        pass
    if run.record_id is None or run.message is None:
        return
    try:
        if run.failure is not None:
            mark_failed(run.record_id, error=error_dict(run.failure), message_id=run.message.message_id)
        else:
            mark_ended(run.record_id, worker=worker_id())
    except Exception as exc:
        log.warning("could not write a task's result", result_id=run.record_id, error=described(exc))


def _ledger(message: MessageProxy) -> Any:
    # Imported here: this module is imported while apps are being readied.
    from composition.jobs.models import ProcessedMessage

    return ProcessedMessage.objects.filter(message_id=ledger_key(message))


def _is_final(exc: BaseException, message: MessageProxy, policy: QueuePolicy) -> bool:
    """Whether this failure ends the task (a dead letter follows) rather than a retry or a requeue."""
    if isinstance(exc, Shutdown):
        return False
    return isinstance(exc, PermanentError) or attempt_of(message) >= policy.job.max_attempts
