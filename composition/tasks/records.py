"""A task's ``TaskRecord`` as its runs keep it: RUNNING when a run starts, then SUCCESSFUL, READY
again before a retry, or FAILED (``composition.jobs.models.TaskRecord`` says what each means).

RUNNING is written in a statement of its own before the run's transaction opens, so a reader sees
it at once; it carries a lease of ``BROKER_HEARTBEAT_TIMEOUT_S`` (the broker's own wait before it
hands a silent worker's messages out again) that ``leases.TaskLeaseRenewer`` renews while the run
lasts. The end of a run is written in its transaction when it succeeds (so SUCCESSFUL commits with
the effects, or not at all), and after its rollback otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

from composition.conf import conf
from composition.db.jsonb import decoded

__all__ = ["RunStart", "dead_letter_resolved", "exception_class_path", "lease_s", "mark_discarded", "mark_ended",
           "mark_failed", "mark_replayed", "mark_running", "mark_succeeded"]

# TaskRecord's table (composition.jobs.models), spelled here: this module is imported while the
# apps load (@task builds the backend), before a model may be.
TABLE = "composition_taskrecord"

# Inserted when the record is gone (pruned, or a message enqueued before records were kept), so a
# replay long after still has a result; never over a success, whose run must not be repeated.
_RUNNING_SQL = f"""
INSERT INTO {TABLE} AS r (id, backend, queue_name, task_path, priority, args, kwargs, status, enqueued_at,
    started_at, last_attempted_at, running_until, worker_ids, errors, message_id)
VALUES (%(id)s, %(backend)s, %(queue)s, %(path)s, 0, %(args)s::jsonb, %(kwargs)s::jsonb, 'RUNNING', now(),
    now(), now(), now() + make_interval(secs => %(lease_s)s), %(workers)s::jsonb, '[]'::jsonb, %(message_id)s)
ON CONFLICT (id) DO UPDATE SET status = 'RUNNING', started_at = COALESCE(r.started_at, now()),
    last_attempted_at = now(), finished_at = NULL, running_until = EXCLUDED.running_until,
    worker_ids = r.worker_ids || EXCLUDED.worker_ids, message_id = EXCLUDED.message_id
    WHERE r.status <> 'SUCCESSFUL'
RETURNING enqueued_at, started_at, last_attempted_at, worker_ids, errors
"""


@dataclass(frozen=True)
class RunStart:
    """What a run's RUNNING write read back: the result a task's context shows."""

    enqueued_at: datetime
    started_at: datetime
    last_attempted_at: datetime
    worker_ids: list[str]
    errors: list[dict[str, str]]


def exception_class_path(error_class: str) -> str:
    """A dead letter's error class as an import path: dead letters name builtins bare
    ("ValueError"), and ``TaskError.exception_class`` imports the path."""
    return error_class if "." in error_class else f"builtins.{error_class}"


def lease_s() -> float:
    return float(conf.BROKER_HEARTBEAT_TIMEOUT_S)


def mark_running(record_id: str, *, alias: str, queue: str, path: str, args: list[Any], kwargs: dict[str, Any],
                 worker: str, message_id: str) -> RunStart | None:
    """Mark the record RUNNING by ``worker`` (creating it if it is gone); None when it succeeded
    already, so this run must not happen. Autocommit: call it outside any transaction."""
    with connection.cursor() as cursor:
        cursor.execute(_RUNNING_SQL, {
            "id": record_id, "backend": alias, "queue": queue, "path": path, "args": json.dumps(args),
            "kwargs": json.dumps(kwargs), "lease_s": lease_s(), "workers": json.dumps([worker]),
            "message_id": message_id})
        row = cursor.fetchone()
    if row is None:
        return None
    enqueued_at, started_at, last_attempted_at, workers, errors = row
    return RunStart(enqueued_at, started_at, last_attempted_at, _json(workers, list), _json(errors, list))


def mark_succeeded(record_id: str, *, return_value: Any, finished_at: datetime, keep_value: bool = False) -> None:
    """SUCCESSFUL with ``return_value``: in the run's transaction, so it commits with the effects.
    ``keep_value`` leaves a return value already there (a duplicate run has none to give)."""
    value = "return_value" if keep_value else "%s::jsonb"
    params = [finished_at] if keep_value else [finished_at, json.dumps(return_value)]
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET status = 'SUCCESSFUL', finished_at = COALESCE(finished_at, %s), "
                       f"running_until = NULL, return_value = {value} WHERE id = %s", [*params, record_id])


def mark_ended(record_id: str, *, worker: str) -> None:
    """READY again: ``worker``'s run ended without an outcome (a retry or a redelivery follows).
    Not when another worker's run has marked it RUNNING since (a duplicate delivery)."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET status = 'READY', running_until = NULL WHERE id = %s "
                       "AND status = 'RUNNING' AND worker_ids ->> -1 = %s", [record_id, worker])


def mark_failed(record_id: str, *, error: dict[str, str], message_id: str) -> None:
    """FAILED with ``error`` added: the task will not run again unless its dead letter is replayed."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET status = 'FAILED', finished_at = now(), running_until = NULL, "
                       "errors = errors || %s::jsonb, message_id = %s WHERE id = %s AND status <> 'SUCCESSFUL'",
                       [json.dumps([error]), message_id, record_id])


def _json(value: Any, kind: type) -> Any:
    found = decoded(value)
    return found if isinstance(found, kind) else kind()


def mark_replayed(record_id: str, *, message_id: str) -> None:
    """READY again, its latest message the replay's (``message_id``): in the replay's transaction."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET status = 'READY', finished_at = NULL, running_until = NULL, "
                       "message_id = %s WHERE id = %s AND status <> 'SUCCESSFUL'", [message_id, record_id])


def mark_discarded(record_id: str, *, message_id: str, error: dict[str, str]) -> None:
    """FAILED for good, its dead letter (of ``message_id``) discarded: with ``error`` added when no
    run recorded the failure (a message parked before it ran), and a ``finished_at``, so that
    retention prunes it in time."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET finished_at = COALESCE(finished_at, now()), running_until = NULL, "
                       "errors = CASE WHEN status = 'FAILED' THEN errors ELSE errors || %s::jsonb END, "
                       "status = 'FAILED' WHERE id = %s AND message_id = %s AND status <> 'SUCCESSFUL'",
                       [json.dumps([error]), record_id, message_id])


def dead_letter_resolved(dead_letter: Any, replay_row: Any) -> None:
    """The task actors' ``RESOLVED_HOOK_OPTION``: a replay sets the result READY, under the
    replay's message; a discard sets it FAILED for good."""
    record_id = dead_letter.payload.get("result") if isinstance(dead_letter.payload, dict) else None
    if not isinstance(record_id, str):
        return  # a message from before results were kept
    if replay_row is not None:
        mark_replayed(record_id, message_id=replay_row.message_id)
    else:
        mark_discarded(record_id, message_id=dead_letter.message_id,
                       error={"exception_class_path": exception_class_path(dead_letter.error_class),
                              "traceback": dead_letter.traceback or ""})
