"""What an ``OutboxBackend``'s ``QUEUES`` and ``OPTIONS`` mean: a run policy per queue.

``OPTIONS`` (``MAX_ATTEMPTS``, ``INITIAL_DELAY_S``, ``MAX_DELAY_S``, ``TIMEOUT_S``, ``ATOMIC``) holds
for every queue unless ``QUEUE_OPTIONS`` overrides it; each queue is a Dramatiq queue of the same
name, run by its own actor (``actor_name``). Parsing only reads the settings, never the broker,
because ``@task`` builds the backend when a tasks module is imported.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from composition.jobs.policy import JobPolicy
from composition.tasks.errors import InvalidBackendOptions

__all__ = ["ACTOR_PREFIX", "BackendOptions", "QueuePolicy", "actor_name", "parse_actor_name"]

# Dramatiq's own rule for queue names (dramatiq.actor), checked here so a bad name is reported
# with the setting that holds it, when the backend is built, not when a worker declares it.
_QUEUE_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9._-]*")
# Backend aliases go into actor names between colons.
_ALIAS = re.compile(r"[^:\s]+")

ACTOR_PREFIX = "composition_run_task"

# The OPTIONS of one queue, their types and the defaults (those of @job).
_DEFAULTS = JobPolicy()
_POLICY_KEYS: dict[str, tuple[type | tuple[type, ...], Any]] = {
    "MAX_ATTEMPTS": (int, _DEFAULTS.max_attempts),
    "INITIAL_DELAY_S": ((int, float), _DEFAULTS.initial_delay_s),
    "MAX_DELAY_S": ((int, float), _DEFAULTS.max_delay_s),
    "TIMEOUT_S": ((int, float), _DEFAULTS.timeout_s),
    "ATOMIC": (bool, True),
}
_BACKEND_KEYS = {*_POLICY_KEYS, "QUEUE_OPTIONS"}


def actor_name(alias: str, queue: str) -> str:
    """The Dramatiq actor that runs the tasks of backend ``alias`` on ``queue``."""
    return f"{ACTOR_PREFIX}:{alias}:{queue}"


def parse_actor_name(name: str) -> tuple[str, str] | None:
    """``(alias, queue)`` of a task actor's name, or None for any other actor."""
    prefix, _, rest = name.partition(":")
    alias, _, queue = rest.partition(":")
    if prefix != ACTOR_PREFIX or not alias or not queue:
        return None
    return alias, queue


@dataclass(frozen=True)
class QueuePolicy:
    """How the tasks of one queue run: the job policy of its actor, and whether the task runs in one
    transaction with its inbox ledger row (``atomic``) or in autocommit with the row written after."""

    job: JobPolicy
    atomic: bool


@dataclass(frozen=True)
class BackendOptions:
    """The parsed ``QUEUES`` and ``OPTIONS`` of one backend alias: a policy per queue."""

    alias: str
    queues: Mapping[str, QueuePolicy]

    @classmethod
    def parse(cls, alias: str, queues: Any, options: Any) -> BackendOptions:
        """Raise ``InvalidBackendOptions`` naming the first bad queue name, key or value."""
        if not isinstance(alias, str) or not _ALIAS.fullmatch(alias):
            raise InvalidBackendOptions(str(alias), "the alias must be a non-empty string without ':' or spaces")
        if isinstance(queues, str) or not all(isinstance(queue, str) for queue in queues):
            raise InvalidBackendOptions(alias, f"QUEUES must be a list of queue names, got {queues!r}")
        names = sorted(set(queues))
        if not names:
            # django.tasks reads an empty QUEUES as "any queue"; workers must know theirs in advance.
            raise InvalidBackendOptions(alias, "QUEUES must name at least one queue")
        for name in names:
            if not _QUEUE_NAME.fullmatch(name):
                raise InvalidBackendOptions(alias, f"queue name {name!r} is not a Dramatiq queue name "
                                                   "(letters, digits, '.', '_' and '-', not starting with a digit)")
        if not isinstance(options, Mapping):
            raise InvalidBackendOptions(alias, f"OPTIONS must be a dict, got {type(options).__name__}")
        _refuse_unknown(alias, "OPTIONS", options, _BACKEND_KEYS)
        per_queue = options.get("QUEUE_OPTIONS", {})
        if not isinstance(per_queue, Mapping):
            raise InvalidBackendOptions(alias, "OPTIONS['QUEUE_OPTIONS'] must be a dict of queue name to options")
        unknown_queues = sorted(set(per_queue) - set(names))
        if unknown_queues:
            raise InvalidBackendOptions(alias, f"OPTIONS['QUEUE_OPTIONS'] names queues that are not in QUEUES: "
                                               f"{unknown_queues}")
        shared = {key: value for key, value in options.items() if key in _POLICY_KEYS}
        policies = {}
        for name in names:
            own = per_queue.get(name, {})
            where = f"OPTIONS['QUEUE_OPTIONS'][{name!r}]"
            if not isinstance(own, Mapping):
                raise InvalidBackendOptions(alias, f"{where} must be a dict")
            _refuse_unknown(alias, where, own, set(_POLICY_KEYS))
            policies[name] = _policy(alias, name, {**shared, **own})
        return cls(alias, policies)


def _refuse_unknown(alias: str, where: str, options: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(str(key) for key in set(options) - known)
    if unknown:
        raise InvalidBackendOptions(alias, f"unknown key(s) {unknown} in {where}; known: {sorted(known)}")


def _policy(alias: str, queue: str, options: Mapping[str, Any]) -> QueuePolicy:
    values: dict[str, Any] = {}
    for key, (kind, default) in _POLICY_KEYS.items():
        value = options.get(key, default)
        # bool is an int: True is not an attempt count.
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise InvalidBackendOptions(alias, f"{key} of queue {queue!r} must be {names}, got {value!r}")
        values[key] = value
    try:
        job = JobPolicy(queue=queue, max_attempts=values["MAX_ATTEMPTS"],
                        initial_delay_s=float(values["INITIAL_DELAY_S"]), max_delay_s=float(values["MAX_DELAY_S"]),
                        timeout_s=float(values["TIMEOUT_S"]), idempotent=values["ATOMIC"])
    except (TypeError, ValueError) as exc:
        raise InvalidBackendOptions(alias, f"queue {queue!r}: {exc}") from None
    return QueuePolicy(job=job, atomic=values["ATOMIC"])
