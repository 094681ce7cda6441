from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from composition.testing import (
    FaultProxy,
    ThrowawayPostgres,
    ThrowawayRedis,
    WorkerProcess,
    current_database_url,
    empty_queues,
    fault_proxy,
    subprocess_env,
    throwaway_postgres,
    throwaway_redis,
)
from tests.helpers import PROXIED_DATABASE, ROOT, delete_rabbitmq_queue


def _roomy_live_server() -> None:
    """Django's live server listens with a backlog of 10 connections (``WSGIServer.
    request_queue_size``): the tests that race 20 and more clients at it saw connections reset
    when its accept loop fell behind on a busy machine. Its documented hook, ``server_class``."""
    from django.core.servers.basehttp import ThreadedWSGIServer
    from django.test.testcases import LiveServerThread

    class RoomyThreadedWSGIServer(ThreadedWSGIServer):
        request_queue_size = 256

    LiveServerThread.server_class = RoomyThreadedWSGIServer


_roomy_live_server()


@pytest.fixture(scope="session", autouse=True)
def _no_cached_answers_from_an_earlier_run() -> None:
    """A new test database numbers its rows from 1 again, while the shared Redis still holds
    what an earlier run cached under those ids (an invoice's answer lives 5 minutes): a run must
    not be served another run's invoice 1. Only the cache-aside entries go (the broker's db and
    the other keys stay)."""
    from django.conf import settings
    from django.core.cache import caches
    from django_redis import get_redis_connection

    for alias in settings.CACHES:
        client = get_redis_connection(alias)
        stale = list(client.scan_iter(match=f"{caches[alias].make_key('composition:ca:')}*", count=1000))
        if stale:
            client.delete(*stale)


@pytest.fixture(scope="session", autouse=True)
def _the_configured_redis_is_left_alone() -> Iterator[None]:
    """The gate tests only what it started: a message queued on the configured broker and a key
    in the configured cache (where a ``./run`` beside the tests keeps its own) are still there
    when the session ends, whatever the tests flushed or consumed on theirs
    (``tests.settings.the_gate_s_own``)."""
    import uuid

    import redis
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.message import Message

    from project import settings as configured

    mark = f"gate_isolation_{uuid.uuid4().hex[:8]}"
    broker_url, cache_url = configured.COMPOSITION["BROKER_URL"], configured.CACHES["default"]["LOCATION"]
    broker = RedisBroker(client=redis.Redis.from_url(broker_url)) if broker_url.startswith("redis") else None
    cache = redis.Redis.from_url(cache_url)
    if broker is not None:
        broker.enqueue(Message(queue_name=mark, actor_name="gate_isolation", args=(), kwargs={}, options={}))
    cache.set(mark, "1", ex=24 * 3600)
    try:
        yield
        assert broker is None or broker.client.llen(f"{broker.namespace}:{mark}") == 1, (
            f"a test emptied the configured broker {broker_url} (a ./run beside the gate would lose its messages)")
        assert cache.get(mark) == b"1", f"a test emptied the configured cache {cache_url} (./run's)"
    finally:
        if broker is not None:
            broker.flush(mark)
            broker.client.close()
        cache.delete(mark)
        cache.close()


@pytest.fixture
def throwaway_redis_server() -> Iterator[ThrowawayRedis]:
    """A private Valkey server for outage tests: freeze or stop it, never the shared one."""
    with throwaway_redis() as server:
        yield server


@pytest.fixture
def scratch_database_url() -> Iterator[str]:
    """An empty database of its own on the test database's server (nothing migrated), dropped
    after the test: what a test migrates or leaves unmigrated there touches no other test."""
    import uuid

    import psycopg

    server_url = current_database_url()
    name = f"composition_migrate_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield current_database_url(name=name)
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# The last migration of composition before the ones the schedules' timing added (0017 on): a
# database left there is one upgraded without ``manage.py migrate``.
BEFORE_SCHEDULE_TIMING = "0016"


@pytest.fixture
def database_before_an_upgrade(scratch_database_url: str) -> str:
    """``scratch_database_url`` migrated up to composition's ``BEFORE_SCHEDULE_TIMING`` only."""
    import subprocess
    import sys

    env = subprocess_env(DATABASE_URL=scratch_database_url, DJANGO_SETTINGS_MODULE="tests.settings")
    migrated = subprocess.run([sys.executable, "manage.py", "migrate", "composition", BEFORE_SCHEDULE_TIMING],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    return scratch_database_url


@pytest.fixture(scope="module")
def proxied_postgres_server() -> Iterator[ThrowawayPostgres]:
    """A private PostgreSQL on TCP loopback (a fault proxy needs TCP), with ``PROXIED_DATABASE``."""
    with throwaway_postgres(PROXIED_DATABASE) as server:
        yield server


@pytest.fixture
def postgres_proxy(proxied_postgres_server: ThrowawayPostgres) -> Iterator[FaultProxy]:
    """A fault proxy in front of ``proxied_postgres_server``, closed after the test."""
    with fault_proxy("127.0.0.1", proxied_postgres_server.port) as proxy:
        yield proxy


@pytest.fixture
def worker_processes(transactional_db: None) -> Iterator[list[WorkerProcess]]:
    """Start ``runworkers`` children with ``spawn(args)``; every one is stopped before teardown.

    The Redis broker starts empty: a message an earlier test left (a delayed retry, or one a
    killed worker held, which the broker's recovery hands back seconds later) would otherwise run
    in this test's workers, and a long one holds their drain."""
    empty_queues()
    started: list[WorkerProcess] = []

    class Spawner(list):  # type: ignore[type-arg]
        def spawn(self, args: list[str] | None = None, **env: str) -> WorkerProcess:
            process = WorkerProcess(args or [], env=subprocess_env(**env)).start()
            started.append(process)
            return process

    yield Spawner()  # type: ignore[misc]
    for process in started:
        process.close()


@pytest.fixture(autouse=True)
def _queues_emptied(request: pytest.FixtureRequest) -> Iterator[None]:
    """``@pytest.mark.empty_queues("a", "b")`` on a test, a class or a module: those queues of the
    test broker (every queue, when none is named) are empty before the test and after it, so no
    message of one test runs in another's workers. With ``rabbitmq=True`` the named queues are
    deleted from RabbitMQ (``RABBITMQ_URL``) instead, with their delay and dead-letter queues."""
    marker = request.node.get_closest_marker("empty_queues")
    if marker is None:
        yield
        return
    empty = _rabbitmq_queues_deleted if marker.kwargs.get("rabbitmq") else empty_queues
    empty(*marker.args)
    yield
    empty(*marker.args)


def _rabbitmq_queues_deleted(*queue_names: str) -> None:
    for name in queue_names:
        delete_rabbitmq_queue(name)


@pytest.fixture
def no_cached_invoices() -> Iterator[None]:
    """No invoice answer cached before or after the test: ids start again in every test
    database, and an answer left in Redis would be served to the next test asking for that id."""
    from composition.cache import invalidate_namespace

    invalidate_namespace("invoice")
    yield
    invalidate_namespace("invoice")


@pytest.fixture
def nudge_only() -> Iterator[None]:
    """Publishing only nudges the relay: committed rows stay pending for a test to relay, or to
    watch the relay take, itself (``composition.testing.left_to_the_relay``)."""
    from composition.testing import left_to_the_relay

    with left_to_the_relay():
        yield


def _rabbitmq_listens(host: str = "127.0.0.1", port: int = 5672) -> bool:
    import socket

    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # RabbitMQ tests run wherever the broker is reachable: RABBITMQ_URL set, CI (which always
    # provides it), or a RabbitMQ listening on its default port.
    if os.environ.get("RABBITMQ_URL") or os.environ.get("CI"):
        return
    if not any("rabbitmq" in item.keywords for item in items) or _rabbitmq_listens():
        return
    skip = pytest.mark.skip(reason="no RabbitMQ on 127.0.0.1:5672; set RABBITMQ_URL to run the RabbitMQ tests")
    for item in items:
        if "rabbitmq" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def api_token() -> str:
    """A bearer token of a superuser for the billing API (the test's own django_db mark gives
    the database)."""
    from django.contrib.auth import get_user_model

    from billing.tokens import create_token

    user = get_user_model().objects.create_superuser("api-tests", "api@example.invalid", "api-tests")
    return create_token(user, "tests")[1]


@pytest.fixture
def api_client(api_token: str) -> Any:
    """A test client that sends the bearer token on every request."""
    from django.test import Client

    return Client(headers={"Authorization": f"Bearer {api_token}"})
