"""Helpers for the outbox tests: read back exactly what the relay put on the Redis broker."""

from __future__ import annotations

import os
from typing import Any

import redis
from dramatiq.message import Message

from composition.broker.configured import configured_broker


def broker_redis() -> redis.Redis:
    """The Redis client of the configured (test) broker."""
    return configured_broker().client  # type: ignore[attr-defined]


def flush_broker() -> None:
    """Empty the test Redis db (never FLUSHALL: other suites share the server)."""
    db = broker_redis().connection_pool.connection_kwargs.get("db", 0)
    assert str(db) == os.environ.get("OUTBOX_TEST_REDIS_DB", str(db))
    broker_redis().flushdb()


def enqueued(queue_name: str) -> list[Message[Any]]:
    """Every message on ``queue_name`` in enqueue order (Dramatiq's list + hash layout)."""
    client = broker_redis()
    ids = client.lrange(f"dramatiq:{queue_name}", 0, -1)
    if not ids:
        return []
    bodies = client.hmget(f"dramatiq:{queue_name}.msgs", ids)
    return [Message.decode(body) for body in bodies if isinstance(body, bytes)]


def delayed(queue_name: str) -> list[Message[Any]]:
    return enqueued(f"{queue_name}.DQ")
