"""``composition.testing.FaultProxy`` in front of a real PostgreSQL (a throwaway one on TCP: the
tests' own may be the embedded server, on a Unix socket only) and the Redis the tests use: each
mode seen by psycopg and redis-py, on connections open before the switch and new ones."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import psycopg
import pytest
import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from composition.testing import FaultProxy, fault_proxy
from tests.helpers import PROXIED_DATABASE

# Well under any timeout a client below has, and well over a loopback round trip.
PROMPTLY_S = 0.5


def redis_url() -> str:
    """The tests' own Redis database (``tests.settings``): only PING is sent to it."""
    return str(settings.CACHES["default"]["LOCATION"])


def redis_target() -> tuple[str, int]:
    target = urlsplit(redis_url())
    return target.hostname or "127.0.0.1", target.port or 6379


@pytest.fixture
def redis_proxy() -> Iterator[FaultProxy]:
    with fault_proxy(*redis_target()) as proxy:
        yield proxy


def postgres_through(proxy: FaultProxy) -> psycopg.Connection[tuple[object, ...]]:
    """A connection to the throwaway server through the proxy; no timeout of any kind."""
    return psycopg.connect(f"postgresql://postgres@127.0.0.1:{proxy.port}/{PROXIED_DATABASE}", autocommit=True)


def redis_through(proxy: FaultProxy, **options: object) -> redis.Redis:
    # redis-py retries a timed-out or failed command 3 times by default: each call here is one try.
    return redis.Redis.from_url(proxy.proxied_url(redis_url()),
                                retry=Retry(NoBackoff(), 0), **options)


def timed(call: Callable[[], object]) -> float:
    started = time.monotonic()
    call()
    return time.monotonic() - started


def test_bytes_pass_through_and_a_delay_holds_each_chunk_on_open_and_new_connections(
        postgres_proxy: FaultProxy, redis_proxy: FaultProxy) -> None:
    with postgres_through(postgres_proxy) as conn:
        client = redis_through(redis_proxy)
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert client.ping() is True
        assert (postgres_proxy.connections, redis_proxy.connections) == (1, 1)

        postgres_proxy.delay(0.3)
        redis_proxy.delay(0.3)
        assert timed(lambda: conn.execute("SELECT 1").fetchone()) >= 0.3
        assert timed(client.ping) >= 0.3
        new_client = redis_through(redis_proxy)
        assert timed(new_client.ping) >= 0.3  # a new connection is delayed too
        new_client.close()

        postgres_proxy.pass_through()
        redis_proxy.pass_through()
        assert timed(lambda: conn.execute("SELECT 1").fetchone()) < 0.3
        assert timed(client.ping) < 0.3
        client.close()


def test_megabytes_pass_whole_both_ways_past_the_proxy_s_buffer(postgres_proxy: FaultProxy) -> None:
    size = 8 * 1024 * 1024
    with postgres_through(postgres_proxy) as conn:
        assert conn.execute("SELECT length(%s::text)", ["x" * size]).fetchone() == (size,)
        assert conn.execute("SELECT md5(repeat('x', %s))", [size]).fetchone() == conn.execute(
            "SELECT md5(%s::text)", ["x" * size]).fetchone()
        (big,) = conn.execute("SELECT repeat('xy', %s)", [size // 2]).fetchone() or ("",)
        assert big == "xy" * (size // 2)


def test_a_blackholed_redis_call_ends_at_the_client_s_socket_timeout(redis_proxy: FaultProxy) -> None:
    client = redis_through(redis_proxy, socket_timeout=1)
    assert client.ping() is True

    redis_proxy.blackhole()
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        client.ping()
    assert 0.9 <= time.monotonic() - started < 2
    # A new connection is accepted, and never answered either.
    new_client = redis_through(redis_proxy, socket_timeout=1)
    with pytest.raises(redis.TimeoutError):
        new_client.ping()
    new_client.close()
    client.close()


def test_a_blackholed_postgres_call_blocks_until_the_proxy_resets_then_new_connections_work(
        postgres_proxy: FaultProxy) -> None:
    """psycopg has no read timeout, the server's statement_timeout never starts (the query never
    reached it) and a cancel would go through the same blackhole: a reset is what ends the call."""
    conn = postgres_through(postgres_proxy)
    assert conn.execute("SELECT 1").fetchone() == (1,)
    postgres_proxy.blackhole()
    outcome: list[BaseException | object] = []

    def query() -> None:
        try:
            outcome.append(conn.execute("SELECT 1").fetchone())
        except BaseException as exc:  # whatever ended the call, the test reads it
            outcome.append(exc)

    blocked = threading.Thread(target=query, name="blackholed-query", daemon=True)
    blocked.start()
    blocked.join(2)
    assert blocked.is_alive() and outcome == [], "a blackholed query returned"

    postgres_proxy.reset()
    started = time.monotonic()
    blocked.join(2)
    assert not blocked.is_alive()
    assert time.monotonic() - started < PROMPTLY_S
    assert len(outcome) == 1 and isinstance(outcome[0], psycopg.OperationalError), outcome
    assert postgres_proxy.connections == 0
    conn.close()

    postgres_proxy.pass_through()
    with postgres_through(postgres_proxy) as fresh:
        assert fresh.execute("SELECT 1").fetchone() == (1,)
        assert postgres_proxy.connections == 1


def test_reset_fails_an_open_connection_s_next_call_at_once_and_refuses_new_ones(
        postgres_proxy: FaultProxy, redis_proxy: FaultProxy) -> None:
    conn = postgres_through(postgres_proxy)
    client = redis_through(redis_proxy)
    assert conn.execute("SELECT 1").fetchone() == (1,)
    assert client.ping() is True

    postgres_proxy.reset()
    redis_proxy.reset()
    assert (postgres_proxy.connections, redis_proxy.connections) == (0, 0)
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert time.monotonic() - started < PROMPTLY_S

    with pytest.raises(psycopg.OperationalError):
        postgres_through(postgres_proxy)
    new_client = redis_through(redis_proxy)
    with pytest.raises(redis.ConnectionError):
        new_client.ping()
    new_client.close()
    assert (postgres_proxy.connections, redis_proxy.connections) == (0, 0)
    conn.close()
    client.close()


def test_close_leaves_no_listening_port_no_thread_and_no_open_connection() -> None:
    with fault_proxy(*redis_target()) as proxy:
        client = redis_through(proxy)
        assert client.ping() is True
        proxy.blackhole()  # a silent connection is closed too
        port, thread_name = proxy.port, f"fault-proxy-{proxy.port}"
        assert thread_name in {thread.name for thread in threading.enumerate()}

    assert proxy.connections == 0
    assert thread_name not in {thread.name for thread in threading.enumerate()}
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    client.close()
    proxy.close()  # again: nothing left to do


def test_only_loopback_targets_are_proxied() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("192.0.2.1", 5432)
