"""Lock time-outs are counted apart from busy refusals, for every kind of lock: a caller that
waited its whole ``timeout_s`` (or ``wait_s``) and gave up moves ``composition_lock_timeouts_total``
by one, as well as the busy outcome of ``composition_lock_acquire_total``; a ``nowait`` or
try-once refusal, which waited for nothing, moves only the busy outcome. Real PostgreSQL, with
the lock held by a second transaction on its own connection (a thread), and real Redis."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest
from django.db import connections, transaction

from composition.locks import LockNotAcquired, acquire_redis_lock, advisory_lock, redis_lock, row_lock
from composition.locks.models import LockFence
from composition.testing import metric_value
from tests.helpers import elsewhere

pytestmark = pytest.mark.django_db(transaction=True)  # the holder's thread must see the row

ROW = "composition.LockFence"  # row_lock's name label: the model's label


def _counts(kind: str, name: str) -> tuple[float, float, float]:
    """(time-outs, busy, acquired) counted so far for the lock ``kind``/``name``."""
    def value(metric: str, **labels: str) -> float:
        return metric_value(metric, kind=kind, name=name, **labels)

    return (value("composition_lock_timeouts_total"), value("composition_lock_acquire_total", outcome="busy"),
            value("composition_lock_acquire_total", outcome="acquired"))


@contextmanager
def _held_by_another_transaction(take: Callable[[], AbstractContextManager[object]]) -> Iterator[None]:
    """``take()`` entered in a transaction of another thread (its own connection), held until
    the with-block ends."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic(), take():
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert locked.wait(10), "the other transaction did not get the lock"
        yield
    finally:
        release.set()
        thread.join(10)


@pytest.fixture
def row() -> str:
    resource = f"lm{uuid.uuid4().hex[:10]}"
    LockFence.objects.create(resource=resource, fence=1)
    return resource


def test_a_row_lock_that_times_out_counts_one_time_out_and_one_busy(row: str) -> None:
    rows = LockFence.objects.filter(resource=row)
    before = _counts("row", ROW)
    with _held_by_another_transaction(lambda: row_lock(LockFence.objects.filter(resource=row))):
        started = time.monotonic()
        with transaction.atomic(), pytest.raises(LockNotAcquired), row_lock(rows, timeout_s=0.2):
            pytest.fail("the row is held")
        assert time.monotonic() - started >= 0.2, "it gave up before its timeout"
        between = _counts("row", ROW)
    with transaction.atomic(), row_lock(rows, timeout_s=0.2):
        pass  # free again: acquired, and no time-out
    after = _counts("row", ROW)
    # The holder's acquisition is one "acquired" too.
    assert [b - a for a, b in zip(before, between, strict=True)] == [1, 1, 1]
    assert [b - a for a, b in zip(between, after, strict=True)] == [0, 0, 1]


@pytest.mark.parametrize("how", [{"nowait": True}, {"timeout_s": 0}], ids=["nowait", "timeout_s=0"])
def test_a_row_lock_refused_without_waiting_is_busy_not_a_time_out(row: str, how: dict[str, Any]) -> None:
    rows = LockFence.objects.filter(resource=row)
    with _held_by_another_transaction(lambda: row_lock(LockFence.objects.filter(resource=row))):
        before = _counts("row", ROW)
        with transaction.atomic(), pytest.raises(LockNotAcquired), row_lock(rows, **how):
            pytest.fail("the row is held")
        after = _counts("row", ROW)
    assert [b - a for a, b in zip(before, after, strict=True)] == [0, 1, 0]


def test_an_advisory_lock_that_times_out_counts_one_time_out_and_one_busy() -> None:
    namespace = f"lm{uuid.uuid4().hex[:10]}"
    with _held_by_another_transaction(lambda: advisory_lock(namespace, 7)):
        before = _counts("advisory", namespace)
        started = time.monotonic()
        with transaction.atomic(), pytest.raises(LockNotAcquired), advisory_lock(namespace, 7, timeout_s=0.2):
            pytest.fail("the lock is held")
        assert time.monotonic() - started >= 0.2, "it gave up before its timeout"
        after = _counts("advisory", namespace)
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 0]


def test_an_advisory_lock_tried_once_is_busy_not_a_time_out() -> None:
    namespace = f"lm{uuid.uuid4().hex[:10]}"
    with _held_by_another_transaction(lambda: advisory_lock(namespace, 7)):
        before = _counts("advisory", namespace)
        with transaction.atomic(), pytest.raises(LockNotAcquired), advisory_lock(namespace, 7, timeout_s=0):
            pytest.fail("the lock is held")
        after = _counts("advisory", namespace)
    assert [b - a for a, b in zip(before, after, strict=True)] == [0, 1, 0]


def test_a_redis_lock_tried_once_is_busy_not_a_time_out() -> None:
    name = f"lm{uuid.uuid4().hex[:10]}"
    with redis_lock(f"{name}:x", ttl_s=5):
        before = _counts("redis", name)
        with pytest.raises(LockNotAcquired):
            elsewhere(lambda: acquire_redis_lock(f"{name}:x", ttl_s=5, wait_s=0))
        after = _counts("redis", name)
    assert [b - a for a, b in zip(before, after, strict=True)] == [0, 1, 0]


def test_a_redis_lock_name_without_a_namespace_counts_under_one_label() -> None:
    # "user-<id>" would be a label value per user: the label is the namespace, or "(none)".
    name = f"lm{uuid.uuid4().hex[:10]}"
    before = _counts("redis", "(none)")
    for i in range(3):
        with redis_lock(f"{name}-{i}", ttl_s=5):
            pass
    assert _counts("redis", "(none)")[2] == before[2] + 3
    assert _counts("redis", f"{name}-0")[2] == 0
