"""Queued work for ``jobs check-compat`` to read (tests/jobs/test_compatibility.py,
bench/bench_check_compat.py): ``compat_job`` and ``compat_other`` messages (tests/jobsapp/deploys.py)
as pending outbox rows, open dead letters, and the Redis broker's ready and delayed messages,
written in bulk; and what each of the ten code changes must report of them."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from django.db import connection
from dramatiq.message import Message

from composition.broker.configured import configured_broker
from composition.jobs.compatibility import GONE
from composition.jobs.models import DeadLetter
from composition.outbox.enqueue import enqueue_many
from composition.outbox.models import OutboxMessage
from tests.jobsapp.deploys import COMPAT_QUEUE

SOURCES = ("outbox", "dead letters", "broker")
# (source, job, reason) of a reported problem
Key = tuple[str, str, str]
# What each breaking change reports of a compat_job message, by whether it gives a note.
REASONS = {
    "remove": (GONE, GONE),
    "rename": (GONE, GONE),
    "add_required": ("missing a required argument 'currency'",) * 2,
    "remove_argument": (None, "unexpected keyword argument 'note'"),
    "change_type": ("argument 'invoice_id' must be str, got int",) * 2,
}


def _payload(index: int) -> tuple[str, dict[str, Any]]:
    """Three in four are compat_job, every other one of those with a note; the rest compat_other."""
    if index % 4 == 3:
        return "compat_other", {"key": f"k{index}"}
    return "compat_job", ({"invoice_id": index, "note": "n"} if index % 2 else {"invoice_id": index})


def queue_compat_work(per_source: int) -> Counter[tuple[str, str, bool]]:
    """Write ``per_source`` messages in each source (on the broker, half ready, half delayed by
    an hour); returns how many of each (source, job, with a note) were written."""
    written: Counter[tuple[str, str, bool]] = Counter()
    rows = []
    for index in range(per_source):
        actor, payload = _payload(index)
        written[("outbox", actor, "note" in payload)] += 1
        written[("dead letters", actor, "note" in payload)] += 1
        written[("broker", actor, "note" in payload)] += 1
        rows.append((actor, payload))
    _insert(rows)
    broker = configured_broker()
    messages = [(Message(queue_name=COMPAT_QUEUE, actor_name=actor, args=(), kwargs=payload, options={}),
                 3_600_000 if index % 2 else None) for index, (actor, payload) in enumerate(rows)]
    enqueue_many(broker, messages)
    return written


def _insert(rows: list[tuple[str, dict[str, Any]]]) -> None:
    import json

    outbox, dead = OutboxMessage._meta.db_table, DeadLetter._meta.db_table
    actors = [actor for actor, _ in rows]
    payloads = [json.dumps(payload) for _, payload in rows]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {outbox} (actor_name, queue_name, payload, headers, status, created_at, attempts, "
            "claimed_by, last_error) SELECT a, %s, p::jsonb, '{}'::jsonb, 'pending', now(), 0, '', '' "
            "FROM unnest(%s::text[], %s::text[]) AS u(a, p)", [COMPAT_QUEUE, actors, payloads])
        cursor.execute(
            f"INSERT INTO {dead} (actor, queue, message_id, payload, args, headers, attempts, error_class, "
            "error_message, traceback, fingerprint, first_failed_at, last_failed_at, status, created_at) "
            "SELECT a, %s, md5(%s || ordinality::text), p::jsonb, '[]'::jsonb, '{}'::jsonb, 1, 'Error', '', '', "
            "'f', now(), now(), 'dead', now() FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS u(a, p)",
            [COMPAT_QUEUE, uuid.uuid4().hex, actors, payloads])


def expected_problems(code: str, written: Counter[tuple[str, str, bool]]) -> dict[tuple[str, str, str], int]:
    """(source, job, reason) → count that ``check-compat`` must report under ``code``."""
    expected: Counter[tuple[str, str, str]] = Counter()
    reasons = REASONS.get(code)
    if reasons is None:
        return {}
    for (source, actor, with_note), count in written.items():
        reason = reasons[with_note]
        if actor == "compat_job" and reason is not None:
            expected[(source, actor, reason)] += count
    return dict(expected)


def matched(reported: list[dict[str, Any]], expected: dict[Key, int]) -> dict[Key, int]:
    """A ``check-compat --json`` report's problems keyed as ``expected_problems`` keys them (by the
    expected reason each one's reason contains; a problem nothing expects keeps its own reason),
    their counts added up: equal to ``expected`` when the report is exact."""
    found: dict[Key, int] = {}
    for problem in reported:
        keys = [key for key in expected
                if key[:2] == (problem["source"], problem["actor"]) and key[2] in str(problem["reason"])]
        key = keys[0] if len(keys) == 1 else (str(problem["source"]), str(problem["actor"]), str(problem["reason"]))
        found[key] = found.get(key, 0) + int(problem["count"])
    return found


def clear_compat_work() -> None:
    """Delete what ``queue_compat_work`` wrote."""
    OutboxMessage.objects.filter(queue_name=COMPAT_QUEUE).delete()
    DeadLetter.objects.filter(queue=COMPAT_QUEUE).delete()
    broker = configured_broker()
    for queue in (COMPAT_QUEUE, f"{COMPAT_QUEUE}.DQ"):
        broker.client.delete(f"{broker.namespace}:{queue}", f"{broker.namespace}:{queue}.msgs")
