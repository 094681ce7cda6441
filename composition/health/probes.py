"""One probe per dependency (database, cache, broker): a fresh connection, bounded by a timeout,
raising on failure. Readiness runs them; components run them at start."""

from __future__ import annotations

import math
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from django.conf import settings
from django.db import connections

from composition.broker.configured import bound_pika_waits, bounded_redis, broker_kind
from composition.conf import conf

__all__ = ["PROBES", "cache_redis_url", "heartbeat_client", "probe_broker", "probe_cache", "probe_database"]


def probe_database(timeout_s: float) -> None:
    """A fresh connection (never one a request or job is using) with the probe's own connect
    and query timeouts, so a frozen server or a silent network cannot hold the probe for long:
    ``timeout_s`` for the query, and for the connect ``timeout_s`` rounded up to whole seconds,
    at least 2 (libpq's floor: it reads 1 as 2)."""
    import psycopg

    # Everything the application connects with (TLS client certificates, service files,
    # target_session_attrs...) except what only Django's own connection understands.
    params = {key: value for key, value in connections["default"].get_connection_params().items()
              if key not in ("cursor_factory", "context", "prepare_threshold", "pool", "server_side_binding",
                             "assume_role")}
    params["connect_timeout"] = max(2, math.ceil(timeout_s))
    with psycopg.connect(**params, autocommit=True) as conn, _cut_after(conn.pgconn.socket, timeout_s), \
            conn.transaction():
        # SET LOCAL, not a startup option (poolers such as PgBouncer refuse unknown ones) nor a
        # session SET (behind a transaction pooler it would stay with the pooler's next client).
        conn.execute(f"SET LOCAL statement_timeout = {max(1, int(timeout_s * 1000))}")
        conn.execute("SELECT 1").fetchone()


@contextmanager
def _cut_after(fileno: int, timeout_s: float) -> Iterator[None]:
    """Shut the connection's socket down if the block is still running after ``timeout_s``.

    ``statement_timeout`` is the server's: on a path that went silent after the connect (a
    partition, a dropped NAT entry, a frozen host whose kernel still answers) the query waited
    until the operating system gave up, a quarter of an hour, and every readiness round till
    then said the database was down. A shutdown wakes the wait: psycopg raises at once."""
    sock = socket.socket(fileno=os.dup(fileno))
    cut = threading.Timer(timeout_s, _shut_down, args=(sock,))
    cut.daemon = True
    cut.start()
    try:
        yield
    finally:
        cut.cancel()
        sock.close()


def _shut_down(sock: socket.socket) -> None:
    with suppress(OSError):  # closed already: the probe ended as the timer fired
        sock.shutdown(socket.SHUT_RDWR)


def cache_redis_url() -> str:
    """The Redis URL of composition's cache alias (its first server when several are given)."""
    location = settings.CACHES[conf.CACHE_ALIAS]["LOCATION"]
    return location[0] if isinstance(location, list | tuple) else str(location)


def _ping_redis(url: str, timeout_s: float) -> None:
    client = bounded_redis(url, socket_timeout_s=timeout_s, connect_timeout_s=timeout_s)
    try:
        client.ping()
    finally:
        client.close()


def probe_cache(timeout_s: float) -> None:
    _ping_redis(cache_redis_url(), timeout_s)


def probe_broker(timeout_s: float) -> None:
    url = conf.BROKER_URL
    if broker_kind(url) == "redis":
        _ping_redis(url, timeout_s)
        return
    import pika

    # A cluster's nodes, ";" between their URLs as Dramatiq takes them: the broker is up when one
    # answers (pika tries them in order), all of them within timeout_s.
    nodes = [pika.URLParameters(node_url) for node_url in url.split(";")]
    share_s = timeout_s / len(nodes)
    for params in nodes:
        bound_pika_waits(params, url, socket_timeout_s=share_s / 2, connect_timeout_s=share_s / 2)
    pika.BlockingConnection(nodes).close()


PROBES: dict[str, Callable[[float], None]] = {
    "database": probe_database,
    "cache": probe_cache,
    "broker": probe_broker,
}


def heartbeat_client() -> Any:
    """A Redis client for the worker heartbeats (kept in the cache's Redis), bounded by the
    health deadline."""
    timeout_s = float(conf.HEALTH_DEADLINE_S)
    return bounded_redis(cache_redis_url(), socket_timeout_s=timeout_s, connect_timeout_s=timeout_s)
