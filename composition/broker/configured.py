"""The Dramatiq broker this process uses, built from ``COMPOSITION["BROKER_URL"]``, never a default.

``configured_broker()`` builds the broker the settings ask for and installs it as Dramatiq's global
broker once; the app's ``ready()`` and every ``@job`` call it first, or Dramatiq's ``get_broker()``
would quietly build a RabbitMQ broker on localhost. This module imports nothing from
``composition.jobs``: the job middleware is loaded by dotted path (``JOB_MIDDLEWARE``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

import dramatiq
from django.utils.module_loading import import_string
from dramatiq.broker import Broker
from dramatiq.middleware import Middleware

from composition.conf import conf, require_installed
from composition.errors import BrokerConfigurationError

__all__ = ["JOB_MIDDLEWARE", "bound_pika_waits", "bounded_redis", "broker_kind", "build_broker", "configured_broker",
           "reset_broker"]

# Builds a broker's default middleware list, the job middleware; its module doc explains the order.
JOB_MIDDLEWARE = "composition.jobs.middleware.stack.job_middleware"
# RabbitMQ may block a publishing connection (a memory or disk alarm) this many socket timeouts
# before pika drops it and the publish fails (a relay batch is released, a retry tried again).
BLOCKED_PUBLISH_PERIODS = 5

_lock = threading.Lock()
_installed: Broker | None = None


def broker_kind(url: str) -> str:
    """``"redis"`` or ``"rabbitmq"`` for a broker URL; raises BrokerConfigurationError otherwise."""
    scheme = urlsplit(url).scheme
    if scheme in ("redis", "rediss", "unix"):
        return "redis"
    if scheme in ("amqp", "amqps"):
        return "rabbitmq"
    raise BrokerConfigurationError(
        f"COMPOSITION['BROKER_URL'] has scheme {scheme!r}; use redis://, rediss:// or amqp://"
    )


def build_broker(url: str, *, heartbeat_timeout_s: float, maintenance_chance: int,
                 socket_timeout_s: float = 2.0, connect_timeout_s: float = 1.0,
                 middleware: Sequence[Middleware] | None = None, max_priority: int | None = None,
                 queue_type: str = "classic", delivery_limit: int = 20) -> Broker:
    """A new, unconnected broker for ``url`` with ``middleware``, by default the job middleware
    (``JOB_MIDDLEWARE``: retry policy, dead letters, per-message hygiene) in place of Dramatiq's
    plain Retries and TimeLimit.

    Redis calls are bounded by ``socket_timeout_s`` / ``connect_timeout_s``: without them a
    frozen Redis (accepting, never answering) would hold a publishing request or a draining
    worker for as long as the client's default allows. The Redis broker is
    ``composition.broker.redis.WakingRedisBroker``, whose idle consumers wait for a message in
    ``BLPOP`` instead of sleeping between polls; a wait lasts 1 s at most, and never
    more than half of ``socket_timeout_s``, so short timeouts stay safe for it. The RabbitMQ broker
    is ``composition.broker.rabbitmq.PausableRabbitmqBroker``, its queues declared as
    ``queue_type`` ("classic" or "quorum", with ``delivery_limit``), classic ones with
    ``x-max-priority`` ``max_priority`` when given. Both stop a paused queue's deliveries
    (``composition.broker.pausing``) and honour message priorities
    (``composition.broker.priorities``).
    """
    stack = list(middleware) if middleware is not None else import_string(JOB_MIDDLEWARE)()
    kind = broker_kind(url)
    if kind == "redis":

        from composition.broker.redis import WakingRedisBroker

        return WakingRedisBroker(
            client=bounded_redis(url, socket_timeout_s=socket_timeout_s, connect_timeout_s=connect_timeout_s),
            middleware=stack,
            heartbeat_timeout=int(heartbeat_timeout_s * 1000),
            maintenance_chance=maintenance_chance,
        )
    try:
        from composition.broker.rabbitmq import PausableRabbitmqBroker
    except ImportError as exc:  # pika is the optional "rabbitmq" extra
        raise BrokerConfigurationError(
            "an amqp:// BROKER_URL needs the rabbitmq extra (from a clone: "
            "pip install './django-backend-composition[rabbitmq]'), or pip install pika"
        ) from exc
    # confirm_delivery: every enqueue (actor.send(), a retry) returns only once RabbitMQ has
    # confirmed the message, and a message no queue takes (mandatory) or a full queue refuses
    # raises instead of vanishing. The cost is one round trip per message (400 to 1,000
    # actor.send() a second on localhost); the outbox relay publishes its batches on a confirm
    # channel of its own, one round trip per batch (composition.outbox.rabbitmq; measured
    # against actor.send() by bench/bench_rabbitmq_relay.py).
    broker = PausableRabbitmqBroker(url=url, middleware=stack, confirm_delivery=True, max_priority=max_priority,
                                    queue_type=queue_type, delivery_limit=delivery_limit)
    for parameters in broker.parameters if isinstance(broker.parameters, list) else [broker.parameters]:
        bound_pika_waits(parameters, url, socket_timeout_s=socket_timeout_s, connect_timeout_s=connect_timeout_s)
    return broker


def bounded_redis(url: str, *, socket_timeout_s: float, connect_timeout_s: float) -> Any:
    """A redis-py client for ``url`` whose connects and calls give up after these timeouts: a
    frozen Redis (accepting, never answering) would otherwise hold the caller indefinitely."""
    import redis

    pool = redis.ConnectionPool.from_url(url, socket_timeout=socket_timeout_s, socket_connect_timeout=connect_timeout_s)
    return redis.Redis(connection_pool=pool)


def bound_pika_waits(parameters: Any, url: str, *, socket_timeout_s: float, connect_timeout_s: float) -> None:
    """Timeouts on pika's connection ``parameters`` of ``url``, where pika's defaults would wait
    10 s for a TCP connect, 15 s for a server that accepts and never answers, and forever while
    RabbitMQ blocks publishers (a memory or disk alarm). Options given in the URL's query win."""
    given = set(parse_qs(urlsplit(url).query))
    for name, value in (("socket_timeout", connect_timeout_s),
                        ("stack_timeout", connect_timeout_s + socket_timeout_s),
                        ("blocked_connection_timeout", BLOCKED_PUBLISH_PERIODS * socket_timeout_s),
                        ("connection_attempts", 1)):
        if name not in given:
            setattr(parameters, name, value)


def configured_broker() -> Broker:
    """The process's broker, built from settings on first use and installed in Dramatiq."""
    global _installed
    with _lock:
        if _installed is None:
            # Every @job and publish() comes here first.
            require_installed("composition's broker (@job, publish)")
            _installed = build_broker(
                conf.BROKER_URL,
                heartbeat_timeout_s=float(conf.BROKER_HEARTBEAT_TIMEOUT_S),
                maintenance_chance=int(conf.BROKER_MAINTENANCE_CHANCE),
                socket_timeout_s=float(conf.BROKER_SOCKET_TIMEOUT_S),
                connect_timeout_s=float(conf.BROKER_CONNECT_TIMEOUT_S),
                max_priority=conf.RABBITMQ_MAX_PRIORITY,
                queue_type=conf.RABBITMQ_QUEUE_TYPE,
                delivery_limit=int(conf.RABBITMQ_DELIVERY_LIMIT),
            )
            dramatiq.set_broker(_installed)
        return _installed


def reset_broker() -> None:
    """Forget the installed broker (closing it); the next ``configured_broker()`` builds anew."""
    global _installed
    with _lock:
        if _installed is not None:
            _installed.close()
        _installed = None
