"""The workers' side: one ``@job`` actor per backend alias and queue runs the tasks sent to it.

The actor imports each task by the module path in its payload and runs it with the jobs' policy.
``ATOMIC`` (the default) runs the task in one transaction with its inbox ledger row; with
``ATOMIC: False`` it runs in autocommit and the row is written after, so a worker dying between the
two runs it again. The ledger row is how ``get_result`` learns a task succeeded. ``task_finished``
is sent once the run's transaction has ended, so a listener's queries are never rolled back with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import os
import socket
import threading
import traceback
from datetime import UTC, datetime
from functools import partial
from typing import Any

import structlog
from asgiref.sync import async_to_sync
from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone
from dramatiq import Actor
from dramatiq.broker import MessageProxy
from dramatiq.middleware import Shutdown
from dramatiq.middleware.time_limit import TimeLimitExceeded

from composition.broker.configured import configured_broker
from composition.broker.time_limits import INTERRUPTS, disarm_time_limit
from composition.conf import conf
from composition.errors import IncompatibleMessageError, PermanentError, described
from composition.jobs import current_message, job
from composition.jobs.compatibility import PAYLOAD_CHECK_OPTION
from composition.jobs.current import attempt_of
from composition.jobs.decorator import run_idempotently
from composition.jobs.deploy_window import refuse
from composition.jobs.inbox import ledger_key, record_processed
from composition.outbox.publish import storable_json
from composition.tasks._compat import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)
from composition.tasks.errors import InvalidTaskReturnValue
from composition.tasks.options import QueuePolicy, actor_name
from composition.tasks.payload import fitting_task

__all__ = ["ATTEMPT_STARTED_HEADER", "MAX_REPLAYS_FOLLOWED", "WORKER_IDS_HEADER", "declare_task_actor",
           "replayed_chain", "worker_id"]

log = structlog.get_logger("composition.tasks")

# Key in the message's composition headers listing the worker of each attempt; the headers
# travel with a retried message and are kept in its dead letter, so a failed task's result
# still says how many attempts it had and where they ran.
WORKER_IDS_HEADER = "task_worker_ids"
# Key in the same headers: when the latest attempt started (Unix seconds), so that a FAILED
# result, read from its dead letter, says when its last run began, as a SUCCESSFUL one does.
ATTEMPT_STARTED_HEADER = "task_attempt_started_at"
# A dead letter replayed, failing again, replayed again...: followed this far at most.
MAX_REPLAYS_FOLLOWED = 20

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

        def run_task(task: str, args: list, kwargs: dict) -> None:
            failed: list[TaskResult[Any, Any]] = []  # a run that failed for good, told once it has rolled back
            message = current_message()
            try:
                if policy.atomic and message is not None:
                    run_idempotently(name, message, _run, (alias, queue, policy, task, args, kwargs, failed), {})
                else:
                    _run(alias, queue, policy, task, args, kwargs, failed)
            finally:
                for result in failed:
                    _finished(result, TaskResultStatus.FAILED)

        # The ledger transaction is run_task's own (run_idempotently), so that FAILED goes out
        # after it; the policy on the actor, which operators' tools read, still says idempotent.
        declare = job(queue=queue, max_attempts=policy.job.max_attempts, initial_delay_s=policy.job.initial_delay_s,
                      max_delay_s=policy.job.max_delay_s, timeout_s=policy.job.timeout_s,
                      idempotent=False, actor_name=name)
        declared = declare(run_task)
        declared.options["job_policy"] = dataclasses.replace(declared.options["job_policy"], idempotent=policy.atomic)
        # jobs check-compat binds queued tasks as the worker will (fitting_task).
        declared.options[PAYLOAD_CHECK_OPTION] = partial(_check_payload, alias, queue)
        return declared


def _check_payload(alias: str, queue: str, args: Any, kwargs: Any) -> None:
    fitting_task(kwargs.get("task"), kwargs.get("args"), kwargs.get("kwargs"), alias=alias, queue=queue)


def _run(alias: str, queue: str, policy: QueuePolicy, path: str, args: list[Any], kwargs: dict[str, Any],
         failed: list[TaskResult[Any, Any]]) -> None:
    """Run the task; a run that fails for good is appended to ``failed`` (with its error) for
    the caller to announce once the transaction is over."""
    message = current_message()
    try:
        # Checked at enqueue; again here, because this worker may run another deploy.
        task = fitting_task(path, args, kwargs, alias=alias, queue=queue)
    except IncompatibleMessageError as exc:
        if message is None:
            raise
        refuse(configured_broker(), message, exc)
    if not policy.atomic and message is not None and _processed(message):
        log.info("task already ran, skipped", task=path)
        return
    result = _running_result(task, alias, message, args, kwargs)
    task_started.send(sender=type(task.get_backend()), task_result=result)
    try:
        returned = _kept(path, _call(task, [TaskContext(task_result=result), *args] if task.takes_context else args,
                                     kwargs, timeout_s=policy.job.timeout_s))
    except BaseException as exc:
        if message is None or _is_final(exc, message, policy):
            result.errors.append(_task_error(exc))
            failed.append(result)
        raise
    if message is not None:
        # What get_result reports of a success: the run's end (processed_at), its start and the
        # worker of every attempt.
        run = {"started_at": result.started_at, "worker_ids": list(result.worker_ids), "return_value": returned}
        if policy.atomic:
            # The ledger row went in when the run began; its time becomes the run's end. Same
            # transaction: it commits with the effects.
            _ledger(message).update(processed_at=Now(), **run)
        else:
            try:
                disarm_time_limit()  # the run is over: an interrupt now would only repeat it
            except INTERRUPTS:
                pass  # landed as the disarm began
            with transaction.atomic():
                if record_processed(ledger_key(message), message.actor_name):
                    _ledger(message).update(**run)
    # After COMMIT of an atomic run (at once otherwise): only then has the task succeeded.
    object.__setattr__(result, "_return_value", returned)
    transaction.on_commit(partial(_finished, result, TaskResultStatus.SUCCESSFUL), robust=True)


def _call(task: Task[Any, Any], args: list[Any], kwargs: dict[str, Any], *, timeout_s: float) -> Any:
    """The task's function called. A coroutine function runs to its end in an event loop of its
    own (``async_to_sync``, as Django's ``Task.call`` runs it), where the ORM's async calls run
    back on this worker thread, its connection and its transaction (the ledger's, for an atomic
    run); and within ``timeout_s``: the job's time limit cannot interrupt a thread that waits for
    a coroutine, so the coroutine is cancelled at that limit itself (``TimeLimitExceeded``,
    retried as an overrun is)."""
    if not inspect.iscoroutinefunction(task.func):
        return task.func(*args, **kwargs)

    async def bounded() -> Any:
        # Not wait_for: a TimeoutError of the task's own must stay its own.
        running = asyncio.ensure_future(task.func(*args, **kwargs))
        done, _ = await asyncio.wait({running}, timeout=timeout_s)
        if not done:
            running.cancel()
            await asyncio.wait({running})
            raise TimeLimitExceeded(f"the task ran over its time limit of {timeout_s:g} s")
        return running.result()

    return async_to_sync(bounded)()


def _kept(path: str, value: Any) -> Any:
    """``value`` as its result keeps it (JSON, as ``normalize_json`` makes it); raises
    ``InvalidTaskReturnValue`` for what is not JSON, cannot be stored, or is too large."""
    try:
        kept = normalize_json(value)
        size = len(storable_json(kept, "the return value"))
    except (TypeError, ValueError) as exc:
        raise InvalidTaskReturnValue(f"{path} returned {type(value).__name__}, which a result cannot keep: "
                                     f"{exc}") from None
    limit = int(conf.TASK_RETURN_VALUE_MAX_BYTES)
    if size > limit:
        raise InvalidTaskReturnValue(f"{path} returned {size} bytes of JSON, over TASK_RETURN_VALUE_MAX_BYTES "
                                     f"({limit})")
    return kept


def _ledger(message: MessageProxy) -> Any:
    # Imported here: this module is imported while apps are being readied.
    from composition.jobs.models import ProcessedMessage

    return ProcessedMessage.objects.filter(message_id=ledger_key(message))


def _processed(message: MessageProxy) -> bool:
    return bool(_ledger(message).exists())


def _running_result(task: Task[Any, Any], alias: str, message: MessageProxy | None, args: list[Any],
                    kwargs: dict[str, Any]) -> TaskResult[Any, Any]:
    """The result a task that takes a context sees: this run, with one worker id per attempt."""
    headers: dict[str, Any] = {}
    result_id = ""
    earlier: list[str] = []
    if message is not None:
        found = message.options.setdefault("composition", {})
        headers = found if isinstance(found, dict) else {}
        result_id = str(headers.get("outbox_id") or message.message_id)
        # Mutated in place: the retried message and its dead letter carry the list on.
        workers = headers.setdefault(WORKER_IDS_HEADER, [])
        if isinstance(workers, list):
            workers.append(worker_id())
        # A replayed dead letter is the same task: the result id the caller holds, and the
        # attempts before the replay (get_result reads the same).
        replay_of = headers.get("replay_of")
        if isinstance(replay_of, int):
            first_id, earlier = replayed_chain(replay_of)
            result_id = first_id or result_id
    published = headers.get("published_at")
    now = timezone.now()
    if message is not None:
        headers[ATTEMPT_STARTED_HEADER] = now.timestamp()
    worker_ids = headers.get(WORKER_IDS_HEADER)
    return TaskResult(
        task=task, id=result_id, status=TaskResultStatus.RUNNING,
        enqueued_at=datetime.fromtimestamp(published, tz=UTC) if isinstance(published, int | float) else None,
        started_at=now, last_attempted_at=now, finished_at=None, args=args, kwargs=kwargs, backend=alias,
        errors=[], worker_ids=[*earlier, *(str(worker) for worker in worker_ids)] if isinstance(worker_ids, list)
        else earlier,
    )


def replayed_chain(dead_letter_id: int) -> tuple[str | None, list[str]]:
    """For a message replaying dead letter ``dead_letter_id``: the result id of the task's first
    message (its outbox row's id) and the workers of every attempt before, oldest first, through
    replays of replays (up to ``MAX_REPLAYS_FOLLOWED``)."""
    from composition.jobs.models import DeadLetter

    result_id: str | None = None
    workers: list[str] = []
    next_id: Any = dead_letter_id
    for _ in range(MAX_REPLAYS_FOLLOWED):
        if not isinstance(next_id, int):
            break
        letter = DeadLetter.objects.filter(pk=next_id).only("headers").first()
        headers = letter.headers if letter is not None and isinstance(letter.headers, dict) else {}
        if not headers:
            break
        attempts = headers.get(WORKER_IDS_HEADER)
        workers = [*(str(worker) for worker in attempts), *workers] if isinstance(attempts, list) else workers
        result_id = str(headers["outbox_id"]) if headers.get("outbox_id") is not None else result_id
        next_id = headers.get("replay_of")
    return result_id, workers


def _is_final(exc: BaseException, message: MessageProxy, policy: QueuePolicy) -> bool:
    """Whether this failure ends the task (a dead letter follows) rather than a retry or a requeue."""
    if isinstance(exc, Shutdown):
        return False
    return isinstance(exc, PermanentError) or attempt_of(message) >= policy.job.max_attempts


def _task_error(exc: BaseException) -> TaskError:
    cls = type(exc)
    return TaskError(exception_class_path=f"{cls.__module__}.{cls.__qualname__}",
                     traceback="".join(traceback.format_exception(exc)))


def _finished(result: TaskResult[Any, Any], status: TaskResultStatus) -> None:
    """Send django.tasks' ``task_finished`` for ``result`` with ``status``, to every listener
    even if one raises (logged): the task's outcome is decided already."""
    now = timezone.now()
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", now)
    for receiver, response in task_finished.send_robust(sender=type(result.task.get_backend()), task_result=result):
        if isinstance(response, Exception):
            log.error("a task_finished listener raised", listener=getattr(receiver, "__qualname__", repr(receiver)),
                      status=str(status), error=described(response))
