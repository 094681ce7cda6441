"""The exceptions that mean "Redis could not be reached or refused the command".

redis-py raises ``RedisError`` subclasses for protocol, timeout and connection failures, but a
socket error can also escape as a bare ``OSError``; code that degrades or fails over when Redis
is away catches both. ``BROKER_FAILURES`` adds Dramatiq's ``BrokerError`` and pika's errors:
what a broker call raises when the broker (Redis or RabbitMQ) is away.
"""

from __future__ import annotations

import importlib.util

import redis
from dramatiq.errors import BrokerError

__all__ = ["BROKER_FAILURES", "REDIS_ERRORS"]

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
