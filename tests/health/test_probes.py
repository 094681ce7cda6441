"""The dependency probes against the real services, a closed port, and a server that accepts and
never answers (as a frozen one does): each probe passes, raises, or gives up within its timeout,
on a connection of its own. (Readiness, which runs them, is tests/health/test_checks.py.)"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from django.conf import settings
from django.db import DataError, connection, connections, transaction
from django.test import override_settings
from django_redis import get_redis_connection

from composition.health.probes import (
    PROBES,
    cache_redis_url,
    heartbeat_client,
    probe_broker,
    probe_cache,
    probe_database,
)
from composition.testing import current_database_url, fault_proxy, free_port
from tests.helpers import unique

RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
# What a probe may take beyond its timeout on a busy machine.
SLACK_S = 0.7


@contextmanager
def _silent_server() -> Iterator[int]:
    """A port where the kernel accepts connections and nothing ever answers, as a frozen server."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as server:
        yield server.getsockname()[1]


def _timed_failure(probe: Callable[[float], None], timeout_s: float) -> tuple[BaseException, float]:
    began = time.monotonic()
    with pytest.raises(Exception) as caught:
        probe(timeout_s)
    return caught.value, time.monotonic() - began


def _caches_at(location: str | list[str], alias: str = "default") -> dict[str, Any]:
    return {**settings.CACHES, alias: {**settings.CACHES[alias], "LOCATION": location}}


def _composition(**overrides: object) -> dict[str, object]:
    return {**settings.COMPOSITION, **overrides}


@pytest.mark.django_db
def test_every_probe_passes_against_the_running_services() -> None:
    assert set(PROBES) == {"database", "cache", "broker"}
    for probe in PROBES.values():
        probe(2.0)


@pytest.mark.django_db
def test_the_database_probe_never_uses_the_connection_a_request_is_using() -> None:
    # A request's connection stuck in a failed transaction says nothing of the server.
    with transaction.atomic(), connection.cursor() as cursor:
        with pytest.raises(DataError):
            cursor.execute("SELECT 1 / 0")
        transaction.set_rollback(True)  # the block ends in a rollback, as the request's would
        probe_database(2.0)


@pytest.fixture
def database_frozen(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The default alias's settings point at a silent server (the probe reads them; Django's
    own connection, not opened by the test, is left alone)."""
    with _silent_server() as port:
        monkeypatch.setitem(connections["default"].settings_dict, "HOST", "127.0.0.1")
        monkeypatch.setitem(connections["default"].settings_dict, "PORT", str(port))
        yield


@pytest.mark.usefixtures("database_frozen")
def test_the_database_probe_gives_up_on_a_server_that_never_answers() -> None:
    import psycopg

    # psycopg waits at least 2 s for a connection, whatever shorter timeout it is given.
    error, took = _timed_failure(probe_database, 2.0)
    assert isinstance(error, psycopg.OperationalError), error
    assert took < 2.0 + SLACK_S, took


@pytest.mark.django_db
def test_the_database_probe_gives_up_on_a_connection_that_goes_silent_after_it_connected(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A partition right after the handshake: the server never sees the query, so its
    # statement_timeout never fires, and the kernel on the far side still ACKs (the proxy's):
    # the probe waited for the operating system, a quarter of an hour.
    import psycopg

    parts = urlsplit(current_database_url())
    if not (parts.hostname or "").startswith("127.") or parts.port is None:
        pytest.skip(f"the fault proxy needs the test database on TCP loopback; this one is {parts.hostname}")
    real_connect = psycopg.connect
    with fault_proxy(parts.hostname or "127.0.0.1", parts.port) as proxy:
        monkeypatch.setitem(connections["default"].settings_dict, "HOST", proxy.host)
        monkeypatch.setitem(connections["default"].settings_dict, "PORT", str(proxy.port))

        def connect_then_cut(*args: Any, **kwargs: Any) -> Any:
            opened = real_connect(*args, **kwargs)
            proxy.blackhole()
            return opened

        monkeypatch.setattr(psycopg, "connect", connect_then_cut)
        error, took = _timed_failure(probe_database, 1.0)
    assert isinstance(error, psycopg.OperationalError), error
    assert took < 1.0 + SLACK_S, took


def test_the_cache_probe_pings_the_cache_alias_s_first_server() -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"
    with override_settings(CACHES=_caches_at(closed)):
        assert cache_redis_url() == closed
        with pytest.raises(redis.ConnectionError):
            probe_cache(1.0)
    # Several servers: the first is probed. COMPOSITION's own cache alias, not always "default".
    running = str(settings.CACHES["default"]["LOCATION"])
    alternate = _caches_at([running, closed], alias="alternate")
    with override_settings(CACHES=alternate, COMPOSITION=_composition(CACHE_ALIAS="alternate")):
        assert cache_redis_url() == running
        probe_cache(1.0)
    reversed_servers = _caches_at([closed, running], alias="alternate")
    with override_settings(CACHES=reversed_servers, COMPOSITION=_composition(CACHE_ALIAS="alternate")), \
            pytest.raises(redis.ConnectionError):
        probe_cache(1.0)


def test_the_cache_probe_gives_up_on_a_frozen_redis_within_its_timeout() -> None:
    with _silent_server() as port, override_settings(CACHES=_caches_at(f"redis://127.0.0.1:{port}/0")):
        error, took = _timed_failure(probe_cache, 0.3)
    assert isinstance(error, redis.TimeoutError), error
    assert took < 0.3 + SLACK_S, took


def test_the_redis_broker_probe_pings_the_broker_url() -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"
    with override_settings(COMPOSITION=_composition(BROKER_URL=closed)), pytest.raises(redis.ConnectionError):
        probe_broker(1.0)
    with _silent_server() as port, override_settings(COMPOSITION=_composition(BROKER_URL=f"redis://127.0.0.1:{port}/0")):
        error, took = _timed_failure(probe_broker, 0.3)
    assert isinstance(error, redis.TimeoutError), error
    assert took < 0.3 + SLACK_S, took


@pytest.mark.rabbitmq
def test_the_rabbitmq_broker_probe_connects_and_gives_up_on_a_frozen_rabbitmq_within_its_timeout() -> None:
    with override_settings(COMPOSITION=_composition(BROKER_URL=RABBITMQ_URL)):
        probe_broker(2.0)
    with _silent_server() as port, \
            override_settings(COMPOSITION=_composition(BROKER_URL=f"amqp://guest:guest@127.0.0.1:{port}/%2F")):
        _, took = _timed_failure(probe_broker, 0.6)
    assert took < 0.6 + SLACK_S, took


def test_the_heartbeat_client_writes_to_the_cache_s_redis_within_the_health_deadline() -> None:
    key = unique("heartbeat-probe-")
    client = heartbeat_client()
    try:
        client.set(key, "beat", ex=60)
        assert get_redis_connection("default").get(key) == b"beat"
    finally:
        client.delete(key)
        client.close()

    with _silent_server() as port, \
            override_settings(CACHES=_caches_at(f"redis://127.0.0.1:{port}/0"),
                              COMPOSITION=_composition(HEALTH_DEADLINE_S=0.3)):
        frozen = heartbeat_client()
        began = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            frozen.ping()
        took = time.monotonic() - began
        frozen.close()
    assert took < 0.3 + SLACK_S, took
