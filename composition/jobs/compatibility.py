"""Which queued work the running code cannot run, for ``manage.py jobs check-compat`` before a
deploy: run it with the new code against the live database and broker.

Every message that could still run is grouped by shape (its job, the version it was published
at, its arguments' JSON types; for a ``django.tasks`` row its task path too) and each shape is
bound once, on one example, with the check the worker makes (``runnable``). It reads only, and
takes no lock a running system needs. The database (``queued_problems``, also ``manage.py
check``'s W140) is read whole; the broker is read by ``composition.jobs.broker_compatibility``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from dramatiq.broker import Broker
from dramatiq.common import q_name

from composition.db.jsonb import decoded
from composition.errors import IncompatibleMessageError, PayloadValidationError, described
from composition.jobs.models import DeadLetter
from composition.outbox.models import OutboxMessage
from composition.outbox.publish import PAYLOAD_SCHEMA_OPTION, VERSION_HEADER, VERSIONS_OPTION

__all__ = ["GONE", "PAYLOAD_CHECK_OPTION", "Problem", "largest_first", "queued_problems", "reads_tables", "runnable",
           "sent_problems"]

GONE = ("no job of this name in the running code (removed, renamed without an alias, or declared in a module "
        "that is not imported: declare jobs in an app's jobs.py)")
# An actor option: a further check of its payloads, raising IncompatibleMessageError (the
# django.tasks actors resolve the task and bind its arguments).
PAYLOAD_CHECK_OPTION = "payload_check"

# A JSON value's type as the payload checks tell them: JSON's own, with a whole number apart from
# a fraction (an int argument refuses 10.5), as ``_json_type`` says it in Python.
_TYPE = ("CASE WHEN jsonb_typeof({value}) = 'number' AND ({value})::text ~ '^-?[0-9]+$' THEN 'integer' "
         "ELSE jsonb_typeof({value}) END")
# A JSON object's keys and each value's type, as one jsonb value: equal shapes group.
_OBJECT_SHAPE = ("(SELECT coalesce(jsonb_object_agg(key, " + _TYPE.format(value="{column} -> key")
                 + "), '{{}}'::jsonb) FROM jsonb_object_keys({column}) AS key)")
_ARRAY_SHAPE = ("(SELECT coalesce(jsonb_agg(" + _TYPE.format(value="value") + " ORDER BY position), '[]'::jsonb) "
                "FROM jsonb_array_elements({column}) WITH ORDINALITY AS element(value, position))")


def _task_shape(column: str) -> str:
    """A django.tasks payload (``{"task": path, "args": [...], "kwargs": {...}}``) groups by its
    task and its arguments' types too; for any other payload this is null."""
    args, kwargs = f"({column} -> 'args')", f"({column} -> 'kwargs')"
    return (f"CASE WHEN jsonb_typeof({column} -> 'task') = 'string' AND jsonb_typeof({args}) = 'array' "
            f"AND jsonb_typeof({kwargs}) = 'object' THEN jsonb_build_array({column} -> 'task', "
            f"{_ARRAY_SHAPE.format(column=args)}, {_OBJECT_SHAPE.format(column=kwargs)}) END")


@dataclass(frozen=True)
class Problem:
    """``count`` messages of ``actor`` in ``source`` the running code would refuse, for ``reason``."""

    # "outbox" (pending rows), "dead letters" (open ones), "broker" (Redis: ready and delayed),
    # "outbox, sent (may have run)" (RabbitMQ: rows sent within the retry horizon)
    source: str
    actor: str
    reason: str
    count: int
    example_id: int | str  # a row's id, or a broker message's id


def reads_tables() -> tuple[str, ...]:
    """The tables ``queued_problems`` reads."""
    return OutboxMessage._meta.db_table, DeadLetter._meta.db_table


def runnable(broker: Broker, actor_name: str, args: Sequence[Any], kwargs: Mapping[str, Any],
             version: Any = 1, *, queue_name: str | None = None) -> str | None:
    """Why the running code would refuse this message, or None when it would run it: the
    worker's own checks (``JobVersions.fit``, an actor's ``PAYLOAD_CHECK_OPTION``). Its job gone
    (removed, or renamed without an alias), a version no upgrade covers, a required argument
    added, an argument removed, a value of another JSON type than its annotation; and, for a
    message already on the broker (``queue_name``), its job moved to another queue."""
    actor = broker.actors.get(actor_name)
    if actor is None:
        return GONE
    if queue_name is not None and q_name(queue_name) != actor.queue_name \
            and q_name(queue_name) not in broker.get_declared_queues():
        # Workers read only the queues their code declares: the old one is read by nobody.
        return (f"waits on queue {q_name(queue_name)!r}, but the job now runs on {actor.queue_name!r} and no "
                f"worker of this code reads {q_name(queue_name)!r}: declare it too until it is empty "
                "(docs/deployment.md)")
    schema = actor.options.get(PAYLOAD_SCHEMA_OPTION)
    versions = actor.options.get(VERSIONS_OPTION)
    extra_check = actor.options.get(PAYLOAD_CHECK_OPTION)
    try:
        if versions is not None:
            args, kwargs = versions.fit(schema, args, kwargs, version)
        elif schema is not None:  # a plain Dramatiq actor has neither: nothing declared to check
            schema.validate(args, kwargs)
        if extra_check is not None:
            extra_check(args, kwargs)
    except IncompatibleMessageError as exc:
        return exc.reason
    except PayloadValidationError as exc:
        return str(exc)
    except Exception as exc:  # an upgrade that raises: the worker would fail the same way
        return f"its upgrade raised {described(exc)}"
    return None


# -- the database -----------------------------------------------------------------------------------
# Pending outbox rows and open dead letters (a replay would run them), grouped in SQL.
def queued_problems(broker: Broker, *, alias: str = DEFAULT_DB_ALIAS) -> list[Problem]:
    """Every group of pending (or held: they run later) outbox rows and open dead letters the
    running code cannot run, largest first: two grouped queries and one to read an example of
    each shape."""
    table = OutboxMessage._meta.db_table
    # A pending row's queue is not checked: the relay sends it to its job's queue of the day.
    outbox = _grouped(alias, table, "actor_name", "'[]'::jsonb", "payload", "status = ANY(%s)",
                      [[OutboxMessage.Status.PENDING.value, OutboxMessage.Status.HELD.value]])
    table = DeadLetter._meta.db_table
    dead = _grouped(alias, table, "actor", "args", "payload", "status = %s AND jsonb_typeof(args) = 'array'",
                    [DeadLetter.Status.DEAD])
    problems = _bound(broker, "outbox", outbox, _examples(alias, OutboxMessage, outbox, "actor_name", None))
    problems += _bound(broker, "dead letters", dead, _examples(alias, DeadLetter, dead, "actor", "args"))
    return largest_first(problems)


def sent_problems(broker: Broker, since: datetime, *, alias: str = DEFAULT_DB_ALIAS) -> list[Problem]:
    """The outbox rows sent since ``since``, or due since (a delayed one), that the running code
    cannot run: on RabbitMQ, what may still wait on the broker (or may have run)."""
    groups = _grouped(alias, OutboxMessage._meta.db_table, "actor_name", "'[]'::jsonb", "payload",
                      # A released held row was due when it was sent.
                      "status = %s AND CASE WHEN due_at IS NULL "
                      "THEN sent_at + make_interval(secs => coalesce(delay_s, 0)) ELSE sent_at END >= %s",
                      [OutboxMessage.Status.SENT, since], queue="queue_name")
    return _bound(broker, "outbox, sent (may have run)", groups,
                  _examples(alias, OutboxMessage, groups, "actor_name", None))


# (actor, queue or None, version, count, first id) per shape
_Group = tuple[str, str | None, Any, int, int]


def _grouped(alias: str, table: str, actor: str, args: str, payload: str, where: str,
             params: list[Any], *, queue: str = "NULL::text") -> list[_Group]:
    """Groups by shape; with ``queue`` (a column: the queue the row was sent to), by queue too."""
    shape = (f"{actor}, {queue}, {_ARRAY_SHAPE.format(column=args)}, {_OBJECT_SHAPE.format(column=payload)}, "
             f"headers -> '{VERSION_HEADER}', {_task_shape(payload)}")
    sql = (f"SELECT {actor}, {queue}, headers -> '{VERSION_HEADER}', count(*), min(id) FROM {table} "
           f"WHERE {where} AND jsonb_typeof({payload}) = 'object' GROUP BY {shape}")
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        return [(name, sent_to, _version(version), int(count), int(first))
                for name, sent_to, version, count, first in cursor]


def _version(value: Any) -> Any:
    """A version header as a raw query reads it from jsonb (none: version 1)."""
    return 1 if value is None else decoded(value)


def _examples(alias: str, model: Any, groups: list[_Group], actor: str, args: str | None) -> dict[int, tuple[Any, Any]]:
    """(args, kwargs) of each group's first row, in one query."""
    fields = [args, "payload"] if args is not None else ["payload"]
    rows = model.objects.using(alias).filter(pk__in=[first for *_, first in groups]).values_list("pk", *fields)
    if args is None:
        return {pk: ([], payload) for pk, payload in rows}
    return {pk: (list(found_args), payload) for pk, found_args, payload in rows}


def _bound(broker: Broker, source: str, groups: Iterable[_Group],
           examples: Mapping[int, tuple[Any, Any]]) -> list[Problem]:
    found: dict[tuple[str, str], list[int]] = {}
    for actor_name, queue_name, version, count, first in groups:
        args, kwargs = examples[first]
        reason = runnable(broker, actor_name, args, dict(kwargs), version, queue_name=queue_name)
        if reason is not None:
            tally = found.setdefault((actor_name, reason), [0, first])
            tally[0] += count
            tally[1] = min(tally[1], first)
    return [Problem(source, actor, reason, count, example) for (actor, reason), (count, example) in found.items()]


def largest_first(problems: list[Problem]) -> list[Problem]:
    """``problems`` by count, largest first (then by source, job and reason)."""
    return sorted(problems, key=lambda problem: (-problem.count, problem.source, problem.actor, problem.reason))
