"""The exceptions that mean "Redis could not be reached or refused the command".

redis-py raises ``RedisError`` subclasses for protocol, timeout and connection failures, but a
socket error can also escape as a bare ``OSError``; code that degrades or fails over when Redis
is away catches both.
"""

from __future__ import annotations

import redis

__all__ = ["REDIS_ERRORS"]

REDIS_ERRORS: tuple[type[BaseException], ...] = (redis.exceptions.RedisError, OSError)
