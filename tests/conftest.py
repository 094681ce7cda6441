from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from composition.testing import ThrowawayRedis, WorkerProcess, subprocess_env, throwaway_redis


@pytest.fixture
def throwaway_redis_server() -> Iterator[ThrowawayRedis]:
    """A private Valkey server for outage tests: freeze or stop it, never the shared one."""
    with throwaway_redis() as server:
        yield server


@pytest.fixture
def worker_processes(transactional_db: None) -> Iterator[list[WorkerProcess]]:
    """Start ``runworkers`` children with ``spawn(args)``; every one is stopped before teardown."""
    started: list[WorkerProcess] = []

    class Spawner(list):  # type: ignore[type-arg]
        def spawn(self, args: list[str] | None = None, **env: str) -> WorkerProcess:
            process = WorkerProcess(args or [], env=subprocess_env(**env)).start()
            started.append(process)
            return process

    yield Spawner()  # type: ignore[misc]
    for process in started:
        process.close()


@pytest.fixture
def nudge_only() -> Iterator[None]:
    """Publishing only nudges the relay (``OUTBOX_SEND_ON_COMMIT`` off): committed rows stay
    pending for a test to relay, or to watch the relay take, itself."""
    from django.conf import settings
    from django.test import override_settings

    with override_settings(COMPOSITION={**settings.COMPOSITION, "OUTBOX_SEND_ON_COMMIT": False}):
        yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # RabbitMQ tests run wherever the broker is reachable; CI always provides it.
    if os.environ.get("RABBITMQ_URL") or os.environ.get("CI"):
        return
    skip = pytest.mark.skip(reason="set RABBITMQ_URL to run the RabbitMQ tests")
    for item in items:
        if "rabbitmq" in item.keywords:
            item.add_marker(skip)
