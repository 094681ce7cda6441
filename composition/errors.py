"""The exception tree shared by every part of composition.

Configuration mistakes are kept apart from runtime failures, so callers can catch the one
without hiding the other.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import redis
from django.core.exceptions import ImproperlyConfigured
from dramatiq.errors import BrokerError

__all__ = [
    "BROKER_FAILURES",
    "REDIS_ERRORS",
    "AmbiguousFingerprintError",
    "BrokerConfigurationError",
    "ComponentError",
    "CompositionError",
    "ConfigurationError",
    "DeadLetterStateError",
    "IncompatibleMessageError",
    "JobError",
    "MigrationsNotApplied",
    "PayloadValidationError",
    "PermanentError",
    "SystemStartError",
    "TransientError",
    "described",
    "exception_text",
]


class CompositionError(Exception):
    """Base class of every error raised by composition."""


class ConfigurationError(CompositionError, ImproperlyConfigured):
    """A setting is missing, malformed or names something that cannot be loaded."""


class BrokerConfigurationError(ConfigurationError):
    """The broker URL or broker options are unusable."""


class ComponentError(CompositionError):
    """A component of a System failed; ``component`` names it."""

    def __init__(self, component: str, message: str) -> None:
        super().__init__(f"component {component!r}: {message}")
        self.component = component


class SystemStartError(ComponentError):
    """A component failed to start; the components started before it were drained and stopped.

    ``rollback`` is that stop's report, as ``System.stop`` returns it.
    """

    def __init__(self, component: str, cause: BaseException, rollback: list[Any]) -> None:
        super().__init__(component, f"failed to start: {type(cause).__name__}: {cause}")
        self.cause = cause
        self.rollback = rollback


class MigrationsNotApplied(CompositionError):
    """composition's migrations are not all applied to the database (an upgrade without
    ``manage.py migrate``, a fresh database): its tables lack what the code queries.
    ``migrations`` names those ``migrate`` would apply."""

    def __init__(self, migrations: list[str]) -> None:
        super().__init__(f"composition's migrations are not applied: {', '.join(migrations)}; "
                         "run python manage.py migrate")
        self.migrations = migrations


# -- jobs -------------------------------------------------------------------------------------------
class JobError(CompositionError):
    """Base class of the errors a job raises to choose what happens to its message."""


class PermanentError(JobError):
    """The job can never succeed with this payload: no retry, straight to the dead letters."""


class TransientError(JobError):
    """The job may succeed later (a dependency is down, a lock is busy): retried with backoff."""


class PayloadValidationError(PermanentError):
    """A message's payload does not fit the job's declared arguments (names or simple types)."""


class IncompatibleMessageError(PayloadValidationError):
    """A queued message the running code cannot run: its job is unknown here, it is of another
    version than the job's upgrades cover, or its arguments do not fit. Parked as a dead letter
    once the deploy window has passed (``DEPLOY_WINDOW_S``), in a group of its own."""

    PREFIX = "incompatible with the running code: "

    def __init__(self, reason: str) -> None:
        super().__init__(self.PREFIX + reason)
        self.reason = reason


class AmbiguousFingerprintError(CompositionError, ValueError):
    """A fingerprint prefix matches more than one failure group (``candidates``, full fingerprints)."""

    def __init__(self, prefix: str, candidates: list[str]) -> None:
        shown = ", ".join(candidates[:10]) + (", ..." if len(candidates) > 10 else "")
        super().__init__(f"fingerprint prefix {prefix!r} matches {len(candidates)} groups ({shown}); "
                         "give more characters")
        self.prefix = prefix
        self.candidates = candidates


class DeadLetterStateError(CompositionError):
    """A dead letter cannot be replayed or discarded because it is no longer dead (``status``)."""

    def __init__(self, dead_letter_id: int, status: str) -> None:
        super().__init__(f"dead letter {dead_letter_id} is already {status}; only a dead one can be "
                         "replayed or discarded")
        self.dead_letter_id = dead_letter_id
        self.status = status


def described(exc: BaseException) -> str:
    """An exception as logs, dead letters and answers show it: ``ValueError: bad input``."""
    return f"{type(exc).__name__}: {exception_text(exc)}"


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when the exception's own ``__str__`` raises: a job failing
    with such an exception must still be retried and dead-lettered, not acknowledged by the
    hook that tried to print it (Dramatiq logs an after-hook's error and acks the message). An
    empty ``str()`` of an exception with arguments (pika's connection errors) gives those."""
    try:
        return str(exc) or "; ".join(str(arg) or repr(arg) for arg in exc.args)
    except Exception as inner:
        return f"<unprintable {type(exc).__name__}: its __str__ raised {type(inner).__name__}>"


# -- what a dependency raises when it is away ----------------------------------------------------
# redis-py raises RedisError subclasses, but a socket error can escape as a bare OSError; a
# broker call adds Dramatiq's BrokerError and pika's errors (Redis or RabbitMQ away).
REDIS_ERRORS: tuple[type[BaseException], ...] = (redis.exceptions.RedisError, OSError)


def _pika_failures() -> tuple[type[BaseException], ...]:
    """pika's, when it is installed (the optional "rabbitmq" extra): Dramatiq wraps most of them
    in ``BrokerError``, but not a connection that hangs in its handshake (a load balancer in
    front of a dead node), whose ``AMQPConnectorException`` escaped the retry's handling and
    had the failed job acknowledged, its retry lost."""
    if importlib.util.find_spec("pika") is None:
        return ()
    from pika.adapters.utils.connection_workflow import AMQPConnectorException
    from pika.exceptions import AMQPError

    return (AMQPError, AMQPConnectorException)


BROKER_FAILURES: tuple[type[BaseException], ...] = (BrokerError, *REDIS_ERRORS, *_pika_failures())
