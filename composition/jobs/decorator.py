"""``@job``: a Dramatiq actor declared with the composition retry policy.

Everything that Dramatiq already does is configured, not rewritten: ``max_retries``
(``max_attempts - 1``), ``min_backoff``/``max_backoff`` (read by ``JobRetries``), ``time_limit``
(``TimeLimit``) and ``throws`` (``PermanentError`` and the job's own permanent types, which
Retries never retries). The function itself is wrapped only to fit the payload to its signature
(upgraded from an older version, ``composition.jobs.versions``; one that cannot be fitted waits
for the deploy, then is parked: ``composition.jobs.deploy_window``) and, for ``idempotent=True``,
to run it in one transaction with the inbox ledger. Aliases are more names for the same actor in
the broker's registry, which Dramatiq's consumer reads before any middleware runs.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast, overload

import dramatiq
import structlog
from django.db import transaction
from dramatiq import Actor
from dramatiq.broker import MessageProxy

from composition.broker.configured import configured_broker
from composition.broker.time_limits import INTERRUPTS, disarm_time_limit
from composition.errors import IncompatibleMessageError, PermanentError
from composition.jobs.current import current_message
from composition.jobs.deploy_window import INCOMPATIBLE_SINCE_OPTION, refuse
from composition.jobs.inbox import ledger_key, record_processed
from composition.jobs.policy import JobPolicy
from composition.jobs.schema import PayloadSchema
from composition.jobs.versions import JobVersions, Upgrade, VersionedActor, message_version
from composition.limits.declared import JobLimits

__all__ = ["job", "run_idempotently"]

log = structlog.get_logger("composition.jobs")

R = TypeVar("R")


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _body(fn: Callable[..., R], args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
    """Run the job body and end its time limit as soon as it returns or raises: an interrupt
    after that point would undo (or retry) a run that already finished."""
    try:
        return fn(*args, **kwargs)
    finally:
        try:
            disarm_time_limit()
        except INTERRUPTS:
            pass  # landed as the disarm began: the body had finished


def run_idempotently(actor_name: str, message: MessageProxy, fn: Callable[..., R], args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> R | None:
    """``fn(*args, **kwargs)`` in one transaction with the inbox ledger row of ``message``, as
    ``@job(idempotent=True)`` runs a job; None, without running it, when that message's effects
    were committed already. The time limit ends before the transaction commits."""
    with transaction.atomic():
        if not record_processed(ledger_key(message), actor_name):
            log.info("message already processed, skipped")
            return None
        # Disarmed before this block commits the effects with their ledger row.
        return _body(fn, args, kwargs)


@overload
def job(fn: Callable[..., R], /) -> Actor[Any, R]: ...


@overload
def job(*, queue: str = "default", max_attempts: int = 5, initial_delay_s: float = 10,
        max_delay_s: float = 900, timeout_s: float = 120,
        permanent: Sequence[type[BaseException]] = (), idempotent: bool = False,
        priority: int = 0, actor_name: str | None = None, concurrency: int | None = None,
        rate: str | None = None, aliases: Sequence[str] | Mapping[str, str] = (), version: int = 1,
        upgrade: Mapping[int, Upgrade] | None = None) -> Callable[[Callable[..., R]], Actor[Any, R]]: ...


def job(fn: Callable[..., R] | None = None, /, *, queue: str = "default", max_attempts: int = 5,
        initial_delay_s: float = 10, max_delay_s: float = 900, timeout_s: float = 120,
        permanent: Sequence[type[BaseException]] = (), idempotent: bool = False,
        priority: int = 0, actor_name: str | None = None, concurrency: int | None = None,
        rate: str | None = None, aliases: Sequence[str] | Mapping[str, str] = (), version: int = 1,
        upgrade: Mapping[int, Upgrade] | None = None) -> Any:
    """Declare the decorated function as a job; returns its Dramatiq ``Actor``. ``@job`` alone is
    ``@job()``, every option at its default, as Dramatiq's ``@actor`` allows.

    ``max_attempts`` counts runs (1 = never retried). Retries wait ``initial_delay_s`` doubling up
    to ``max_delay_s``, with jitter. A run longer than ``timeout_s`` is interrupted and retried.
    ``PermanentError``, the types in ``permanent`` and a payload that does not fit the function's
    arguments go straight to the dead letters; ``TransientError`` and any other exception retry.
    With ``idempotent=True`` the function's database effects commit in one transaction with the
    inbox ledger row of the message id (for a replayed dead letter, the original message's id),
    so a redelivered or replayed message has no second effect (the function must not commit on
    its own). ``concurrency=N`` allows at most N runs at once in the whole cluster, ``rate="100/10s"``
    at most 100 starts in any 10 s (docs/limits.md); a run over a limit waits in its queue's delay
    queue, not in a worker thread, and is neither a failure nor a retry. The actor binds to
    ``composition.broker.configured.configured_broker()`` at decoration time; the actor name
    defaults to the function's name.

    Deploys (docs/deployment.md): ``aliases=["old_name"]`` runs messages published under the old
    names (``{"old_name": "old_queue"}`` when it lived on another queue, which is then declared
    and consumed too); ``version=2, upgrade={1: fn}`` changes the arguments: ``fn`` turns the
    keyword arguments of a version-1 message into those of version 2 before the call.

    Raises ValueError/TypeError for an inconsistent policy, and Dramatiq's ValueError when the
    actor name, or an alias, is taken.
    """
    if actor_name is not None and (not isinstance(actor_name, str) or not actor_name or len(actor_name) > 255
                                   or any(char.isspace() for char in actor_name)):
        # "" fell back to the function's name; 5 raised from inside Dramatiq; over 255 characters
        # every publish failed at the outbox's column.
        raise ValueError(f"actor_name must be a name of at most 255 characters without spaces, got {actor_name!r}")
    limits = JobLimits.of(concurrency, rate)
    versions = JobVersions.of(version, upgrade)
    if isinstance(permanent, type) or not isinstance(permanent, Sequence):
        raise TypeError(f"permanent must be a sequence of exception classes, got {permanent!r} "
                        "(for one class: permanent=(TheError,))")
    policy = JobPolicy(queue=queue, max_attempts=max_attempts, initial_delay_s=initial_delay_s,
                       max_delay_s=max_delay_s, timeout_s=timeout_s,
                       permanent=tuple(permanent), idempotent=idempotent, priority=priority)
    old_names = _aliases(aliases, queue)

    def decorate(fn: Callable[..., R]) -> Actor[Any, R]:
        if inspect.iscoroutinefunction(fn):
            # Dramatiq would call it and drop the coroutine unrun: the job would "succeed" doing
            # nothing, and its effects would never be.
            raise TypeError(f"@job cannot run {fn.__qualname__}, an async def: declare a plain function "
                            "(asgiref.sync.async_to_sync(...) runs async code from one)")
        if positional_only := [name for name, parameter in inspect.signature(fn).parameters.items()
                               if parameter.kind is inspect.Parameter.POSITIONAL_ONLY]:
            # A payload fills the parameters by keyword: this one could never be given.
            raise TypeError(f"@job cannot run {fn.__qualname__}: its parameter {', '.join(positional_only)} is "
                            "positional-only, and a payload gives arguments by keyword (drop the '/')")
        name = actor_name or fn.__name__
        schema = PayloadSchema.of(fn, name)
        broker = configured_broker()

        declared: list[Actor[Any, R]] = []  # this job's actor, once declared

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> R | None:
            message = current_message()
            if message is None or broker.actors.get(message.actor_name) is not declared[0]:
                # Called as a function (outside a worker, or from another job's body): the
                # message being run, if any, is not this job's.
                schema.validate(args, kwargs)
                return _body(fn, args, kwargs)
            try:
                args, kwargs = versions.fit(schema, args, kwargs, message_version(message.options))  # type: ignore[assignment]
            except IncompatibleMessageError as exc:
                refuse(broker, message, exc)
            # It fits: a deploy window a refusal started is over (a retry must not carry it on).
            message.options.pop(INCOMPATIBLE_SINCE_OPTION, None)
            if not policy.idempotent:
                return _body(fn, args, kwargs)
            return run_idempotently(name, message, fn, args, kwargs)

        for old_name in old_names:
            if old_name == name or old_name in broker.actors:
                raise ValueError(f"alias {old_name!r} of job {name!r} is taken")
        declare = dramatiq.actor(
            broker=broker,
            actor_name=name,
            queue_name=queue,
            priority=priority,
            max_retries=policy.max_retries,
            min_backoff=_ms(policy.initial_delay_s),
            max_backoff=_ms(policy.max_delay_s),
            time_limit=_ms(policy.timeout_s),
            throws=(PermanentError, *policy.permanent),
            job_policy=policy,
            payload_schema=schema,  # publish() checks payloads with it (PAYLOAD_SCHEMA_OPTION)
            job_limits=limits,  # LimitedStarts reads it (None: no limit, nothing to do)
            job_versions=versions,  # publish() and VersionedActor stamp messages with it
            actor_class=VersionedActor,
        )
        # The wrapper returns None for a skipped redelivery, hence the cast back to the job's type.
        actor = cast("Actor[Any, R]", declare(cast("Callable[..., Any]", run)))
        declared.append(actor)
        for old_name, old_queue in old_names.items():
            broker.actors[old_name] = actor
            if old_queue != queue:
                broker.declare_queue(old_queue)
        return actor

    if fn is None:
        return decorate
    if not callable(fn):
        # @job("billing") took the queue for the function.
        raise TypeError(f"@job takes its options by keyword, e.g. @job(queue={fn!r}); got {fn!r} where a "
                        "function goes")
    return decorate(fn)


def _aliases(aliases: Sequence[str] | Mapping[str, str], queue: str) -> dict[str, str]:
    """Each old name with the queue its messages wait on; raises TypeError/ValueError."""
    if isinstance(aliases, str):
        raise TypeError(f"aliases must be a list of names (or a dict of name to queue), got {aliases!r}")
    pairs = aliases.items() if isinstance(aliases, Mapping) else ((name, queue) for name in aliases)
    found: dict[str, str] = {}
    for old_name, old_queue in pairs:
        if not isinstance(old_name, str) or not old_name or not isinstance(old_queue, str) or not old_queue:
            raise ValueError(f"an alias is a non-empty job name (with a non-empty queue), got {old_name!r}")
        found[old_name] = old_queue
    return found
