"""Which queued work the running code cannot run (``queued_problems``), for ``manage.py jobs
check-compat`` before a deploy: run it with the new code against the live database.

Pending outbox rows and open dead letters are grouped by shape in SQL (the job's name, the
positional arguments' JSON types, each keyword's JSON type), and each distinct shape is bound
once, on its first row, with the checker ``publish()`` and the workers use (``PayloadSchema``):
a job that is gone, a required argument added, an argument removed, a value of another JSON type
than its annotation. It only reads, two grouped queries and one row per shape, and takes no lock
a running system needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from dramatiq.broker import Broker

from composition.errors import PayloadValidationError
from composition.jobs.models import DeadLetter
from composition.outbox.models import OutboxMessage
from composition.outbox.publish import PAYLOAD_SCHEMA_OPTION

__all__ = ["GONE", "Problem", "queued_problems", "reads_tables"]

GONE = "no job of this name in the running code (removed, or renamed without an alias)"

# A JSON object's keys and each value's JSON type, as one jsonb value: equal shapes group.
_KWARGS_SHAPE = ("(SELECT coalesce(jsonb_object_agg(key, jsonb_typeof({column} -> key)), '{{}}'::jsonb) "
                 "FROM jsonb_object_keys({column}) AS key)")
_ARGS_SHAPE = ("(SELECT coalesce(jsonb_agg(jsonb_typeof(value) ORDER BY position), '[]'::jsonb) "
               "FROM jsonb_array_elements({column}) WITH ORDINALITY AS element(value, position))")


@dataclass(frozen=True)
class Problem:
    """``count`` messages of ``actor`` in ``source`` the running code would refuse, for ``reason``."""

    source: str  # "outbox" (pending rows) or "dead letters" (open ones, which a replay would run)
    actor: str
    reason: str
    count: int
    example_id: int


def reads_tables() -> tuple[str, ...]:
    """The tables ``queued_problems`` reads."""
    return OutboxMessage._meta.db_table, DeadLetter._meta.db_table


def _groups(sql: str, params: list[Any], alias: str) -> list[tuple[str, int, int]]:
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        return [(actor, int(count), int(first)) for actor, _, _, count, first in cursor.fetchall()]


def _outbox_groups(alias: str) -> list[tuple[str, int, int]]:
    table = OutboxMessage._meta.db_table
    sql = (f"SELECT actor_name, '[]'::jsonb, {_KWARGS_SHAPE.format(column='payload')}, count(*), min(id) "
           f"FROM {table} WHERE status = %s AND jsonb_typeof(payload) = 'object' GROUP BY 1, 2, 3")
    return _groups(sql, [OutboxMessage.Status.PENDING], alias)


def _dead_letter_groups(alias: str) -> list[tuple[str, int, int]]:
    table = DeadLetter._meta.db_table
    sql = (f"SELECT actor, {_ARGS_SHAPE.format(column='args')}, {_KWARGS_SHAPE.format(column='payload')}, "
           f"count(*), min(id) FROM {table} WHERE status = %s AND jsonb_typeof(payload) = 'object' "
           f"AND jsonb_typeof(args) = 'array' GROUP BY 1, 2, 3")
    return _groups(sql, [DeadLetter.Status.DEAD], alias)


def _reason(broker: Broker, actor_name: str, args: list[Any], kwargs: dict[str, Any]) -> str | None:
    """Why the running code would refuse this payload, or None when it would run it."""
    actor = broker.actors.get(actor_name)
    if actor is None:
        return GONE
    schema = actor.options.get(PAYLOAD_SCHEMA_OPTION)
    if schema is None:  # a plain Dramatiq actor: nothing declared to check against
        return None
    try:
        schema.validate(args, kwargs)
    except PayloadValidationError as exc:
        return str(exc)
    return None


def queued_problems(broker: Broker, *, alias: str = DEFAULT_DB_ALIAS) -> list[Problem]:
    """Every group of queued work in the database the running code cannot run, largest first."""
    found: dict[tuple[str, str, str], list[int]] = {}
    for source, groups in (("outbox", _outbox_groups(alias)), ("dead letters", _dead_letter_groups(alias))):
        for actor_name, count, first in groups:
            args: list[Any]
            kwargs: dict[str, Any]
            if source == "outbox":
                args, kwargs = [], OutboxMessage.objects.using(alias).values_list("payload", flat=True).get(pk=first)
            else:
                args, kwargs = DeadLetter.objects.using(alias).values_list("args", "payload").get(pk=first)
            reason = _reason(broker, actor_name, list(args), dict(kwargs))
            if reason is None:
                continue
            tally = found.setdefault((source, actor_name, reason), [0, first])
            tally[0] += count
            tally[1] = min(tally[1], first)
    problems = [Problem(source, actor, reason, count, example)
                for (source, actor, reason), (count, example) in found.items()]
    return sorted(problems, key=lambda problem: (-problem.count, problem.source, problem.actor))
