"""``get_result``: a task's state, read from the rows the outbox and the jobs already keep.

The result id is the outbox row's id; nothing is written for a status. In this order:
``SUCCESSFUL`` when the inbox ledger has the message; ``FAILED`` when its dead letter, followed
through its replays, ended dead or discarded; ``RUNNING`` when a worker heartbeat shows it running;
else ``READY``. A result is found while its outbox row or dead letter is kept; a success's return
value is kept in its ledger row.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from django.utils import timezone

from composition.conf import conf
from composition.errors import described
from composition.health import heartbeats, probes
from composition.jobs.inbox import IDEMPOTENCY_KEY_HEADER
from composition.tasks._compat import (
    DEFAULT_TASK_PRIORITY,
    InvalidTask,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)
from composition.tasks.actors import ATTEMPT_STARTED_HEADER, MAX_REPLAYS_FOLLOWED, WORKER_IDS_HEADER
from composition.tasks.options import parse_actor_name
from composition.tasks.payload import resolve_task

__all__ = ["MAX_REPLAYS_FOLLOWED", "read_result"]  # the first kept here for old imports

log = structlog.get_logger("composition.tasks")



def read_result(alias: str, result_id: str) -> TaskResult[Any, Any]:
    """The result of the task enqueued on backend ``alias`` as ``result_id``.

    Raises ``TaskResultDoesNotExist`` for an id that is not a task of this backend (never
    committed, another backend's, or pruned). A task whose function a later deploy removed or
    renamed still has its result, with a stand-in task (``_task_or_stand_in``).
    """
    # Imported here: the backend (hence this module) is built by @task, possibly while apps load.
    from composition.jobs.models import DeadLetter, ProcessedMessage
    from composition.outbox.models import OutboxMessage, message_id_for

    if not isinstance(result_id, str) or not result_id.isascii() or not result_id.isdigit():
        raise TaskResultDoesNotExist(result_id)
    outbox_id = int(result_id)
    message_id = message_id_for(outbox_id)
    row = OutboxMessage.objects.filter(pk=outbox_id).first()
    first_dead = DeadLetter.objects.filter(message_id=message_id).first()
    if row is not None:
        actor, payload, headers = row.actor_name, row.payload, row.headers
        enqueued_at: datetime | None = row.created_at
        run_after = row.created_at + timedelta(seconds=row.delay_s) if row.delay_s else None
    elif first_dead is not None:
        actor, payload, headers = first_dead.actor, first_dead.payload, first_dead.headers
        published = headers.get("published_at") if isinstance(headers, dict) else None
        enqueued_at = datetime.fromtimestamp(published, tz=UTC) if isinstance(published, int | float) else None
        run_after = None
    else:
        raise TaskResultDoesNotExist(result_id)
    parsed = parse_actor_name(actor)
    if parsed is None or parsed[0] != alias or not isinstance(payload, dict):
        raise TaskResultDoesNotExist(result_id)
    headers = headers if isinstance(headers, dict) else {}
    task = _task_or_stand_in(result_id, str(payload.get("task")), alias=alias, queue=parsed[1], run_after=run_after)

    # The dead letters of the message and of its replays, oldest first; ``current`` is the id of
    # the message that would run next (the last replay's).
    chain = [first_dead] if first_dead is not None else []
    current = message_id
    while chain and len(chain) <= MAX_REPLAYS_FOLLOWED:
        last = chain[-1]
        if last.status != DeadLetter.Status.REPLAYED or last.replay_outbox_id is None:
            break
        current = message_id_for(last.replay_outbox_id)
        replayed = DeadLetter.objects.filter(message_id=current).first()
        if replayed is None:
            break
        chain.append(replayed)

    fields: dict[str, Any] = {"started_at": None, "finished_at": None, "last_attempted_at": None,
                              "worker_ids": [], "errors": [_task_error(dead) for dead in chain]}
    key = headers.get(IDEMPOTENCY_KEY_HEADER)
    processed = ProcessedMessage.objects.filter(message_id=key if isinstance(key, str) and key else message_id) \
        .values_list("processed_at", "started_at", "worker_ids", "return_value").first()
    returned = None
    if processed is not None:
        status = TaskResultStatus.SUCCESSFUL
        processed_at, started_at, workers, returned = processed
        # A row written before the ledger kept the run (migration 0007) knows only its end.
        fields.update(started_at=started_at, finished_at=processed_at, last_attempted_at=started_at or processed_at,
                      worker_ids=[str(worker) for worker in workers] if isinstance(workers, list) else [])
    elif chain and chain[-1].status in (DeadLetter.Status.DEAD, DeadLetter.Status.DISCARDED):
        status = TaskResultStatus.FAILED
        last = chain[-1]
        # Every attempt of the task, replays included: its dead letters' workers, oldest first.
        workers = [str(worker) for dead in chain for worker in _workers_of(dead)]
        # When its last run began (a dead letter written before the header was: when it failed).
        began = last.headers.get(ATTEMPT_STARTED_HEADER) if isinstance(last.headers, dict) else None
        started_at = datetime.fromtimestamp(began, tz=UTC) if isinstance(began, int | float) else last.last_failed_at
        fields.update(started_at=started_at, finished_at=last.last_failed_at, last_attempted_at=started_at,
                      worker_ids=workers)
    else:
        running = None if row is not None and row.status == OutboxMessage.Status.PENDING and not chain \
            else _running(current)
        if running is not None:
            status = TaskResultStatus.RUNNING
            started_at = datetime.fromtimestamp(running["started_at"], tz=UTC)
            fields.update(started_at=started_at, last_attempted_at=started_at, worker_ids=[running["worker"]])
        elif _outcome_pruned(chain[-1].replay_outbox_id if chain else outbox_id):
            # Neither success nor failure on record, and sent long enough ago that its ledger
            # row (the record of a success) may have been pruned: unknown, not READY.
            raise TaskResultDoesNotExist(f"{result_id}: its run ended long enough ago that its record was pruned")
        else:
            status = TaskResultStatus.READY
    result: TaskResult[Any, Any] = TaskResult(
        task=task, id=result_id, status=status, enqueued_at=enqueued_at, args=payload.get("args") or [],
        kwargs=payload.get("kwargs") or {}, backend=alias, **fields)
    object.__setattr__(result, "_return_value", returned)  # as Django's own backends set it
    return result


def _task_or_stand_in(result_id: str, path: str, *, alias: str, queue: str,
                      run_after: datetime | None) -> Task[Any, Any]:
    """The task at ``path``; when that no longer names a task (a deploy removed or renamed it), a
    stand-in under the same module path whose call raises ``InvalidTask``, so that the result
    still tells what became of the run (its dead letter, most likely). Raises
    ``TaskResultDoesNotExist`` when not even a stand-in can be built (its queue is gone)."""
    try:
        return resolve_task(path, alias=alias, queue=queue, run_after=run_after)
    except (ImportError, InvalidTask) as exc:
        reason = described(exc)
    module, _, name = path.rpartition(".")

    def gone(*args: Any, **kwargs: Any) -> None:
        raise InvalidTask(f"{path} is no longer a task ({reason})")

    gone.__module__, gone.__name__, gone.__qualname__ = module or "__main__", name or path, name or path
    # Django 6's Task has no default priority (the backport's has); the removed task's own is unknown.
    fields: dict[str, Any] = {"func": gone, "priority": DEFAULT_TASK_PRIORITY, "backend": alias, "queue_name": queue,
                              "run_after": run_after, "takes_context": False}
    try:
        return Task(**{field.name: fields[field.name] for field in dataclasses.fields(Task) if field.name in fields})
    except InvalidTask as exc:
        raise TaskResultDoesNotExist(f"{result_id}: its task {path} cannot be built any more: {exc}") from None


def _outcome_pruned(outbox_id: int | None) -> bool:
    """Whether the message of outbox row ``outbox_id`` was due (sent, and past any delay) more
    than ``INBOX_RETENTION_S`` ago, so that a success may be on record no longer."""
    from composition.outbox.models import OutboxMessage

    retention = conf.INBOX_RETENTION_S
    if retention is None or outbox_id is None:
        return False
    row = OutboxMessage.objects.filter(pk=outbox_id, status=OutboxMessage.Status.SENT).only(
        "sent_at", "created_at", "delay_s").first()
    if row is None or row.sent_at is None:
        return False
    due = max(row.sent_at, row.created_at + timedelta(seconds=row.delay_s or 0))
    return timezone.now() - due > timedelta(seconds=float(retention))


def _workers_of(dead: Any) -> list[Any]:
    workers = dead.headers.get(WORKER_IDS_HEADER) if isinstance(dead.headers, dict) else None
    return workers if isinstance(workers, list) else []


def _task_error(dead: Any) -> TaskError:
    # Dead letters name builtins bare ("ValueError"); TaskError.exception_class imports the path.
    path = dead.error_class if "." in dead.error_class else f"builtins.{dead.error_class}"
    return TaskError(exception_class_path=path, traceback=dead.traceback)


def _running(message_id: str) -> dict[str, Any] | None:
    """The job entry (with its ``worker``) of a worker heartbeat that shows ``message_id`` running;
    None when none does, or when the heartbeats cannot be read (then the task reads as READY)."""
    try:
        client = probes.heartbeat_client()
        try:
            beats = heartbeats.read_heartbeats(client)
        finally:
            client.close()
    except Exception as exc:
        log.warning("could not read worker heartbeats for a task result", error=described(exc))
        return None
    for beat in beats:
        for entry in beat.get("jobs") or ():
            if isinstance(entry, dict) and entry.get("job_id") == message_id \
                    and isinstance(entry.get("started_at"), int | float):
                return {**entry, "worker": str(beat.get("worker", ""))}
    return None
