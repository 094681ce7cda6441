"""The exceptions that mean "Redis could not be reached or refused the command".

redis-py raises ``RedisError`` subclasses for protocol, timeout and connection failures, but a
socket error can also escape as a bare ``OSError``; code that degrades or fails over when Redis
is away catches both. ``BROKER_FAILURES`` adds Dramatiq's ``BrokerError``: what a broker call
raises when the broker (Redis or RabbitMQ) is away.
"""

from __future__ import annotations

import redis
from dramatiq.errors import BrokerError

__all__ = ["BROKER_FAILURES", "REDIS_ERRORS"]

REDIS_ERRORS: tuple[type[BaseException], ...] = (redis.exceptions.RedisError, OSError)
BROKER_FAILURES: tuple[type[BaseException], ...] = (BrokerError, *REDIS_ERRORS)
