"""Fixtures of the upstream tests: real ``runworkers`` processes serving their alias's queues (one
for a whole test class, ``upstream_worker``, or as a test starts them, ``upstream_workers``)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from composition.testing import WorkerProcess
    from tests.tasks.upstream.workers import UpstreamWorkers

if not (importlib.util.find_spec("django.tasks") or importlib.util.find_spec("django_tasks")):
    # As tests/tasks/test_backend.py: without either package there is no backend to test.
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture
def upstream_workers(transactional_db: None) -> Iterator[UpstreamWorkers]:
    """``spawn(*queues)`` worker processes for one test; all stopped at its end."""
    from tests.tasks.upstream.workers import UpstreamWorkers

    workers = UpstreamWorkers()
    yield workers
    workers.close()


@pytest.fixture(scope="class")
def upstream_worker(django_db_setup: None) -> Iterator[WorkerProcess]:
    """One worker process serving ``QUEUE`` for a whole test class (started once the test
    database exists, which it reads by its URL); stopped after the class's last test."""
    from composition.testing import empty_queues
    from tests.tasks.upstream import QUEUE, QUEUE_1
    from tests.tasks.upstream.workers import UpstreamWorkers

    empty_queues(QUEUE, QUEUE_1)
    workers = UpstreamWorkers()
    workers.spawn(QUEUE)
    yield workers.started[0]
    workers.close()
