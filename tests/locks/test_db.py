"""row_lock and advisory_lock against the real PostgreSQL, with a second transaction in another
thread or another process."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from django.db import DataError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from prometheus_client import REGISTRY

from composition.locks import (
    LockNotAcquired,
    TransactionRequired,
    advisory_key,
    advisory_lock,
    row_lock,
)
from composition.locks.models import LockFence
from composition.testing import subprocess_env
from tests.helpers import ROOT, HeldInAnotherTransaction, unique

pytestmark = pytest.mark.django_db(transaction=True)


def lock_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        return str(cursor.fetchone()[0])


def row_holder(resource: str) -> HeldInAnotherTransaction:
    """Another transaction holding the row lock of ``resource``'s fence."""
    return HeldInAnotherTransaction(lambda: LockFence.objects.select_for_update().get(resource=resource))


def advisory_holder(namespace: str, key: str) -> HeldInAnotherTransaction:
    """Another transaction holding the advisory lock of (namespace, key)."""
    def take() -> None:
        with advisory_lock(namespace, key):
            pass  # held until the transaction ends

    return HeldInAnotherTransaction(take)


@pytest.fixture
def row() -> Iterator[str]:
    resource = unique("lk")
    LockFence.objects.create(resource=resource, fence=1)
    yield resource


def test_row_lock_nowait_raises_at_once_and_leaves_the_transaction_usable(row: str) -> None:
    with row_holder(row), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '7s'")
        started = time.monotonic()
        with pytest.raises(LockNotAcquired) as caught, row_lock(LockFence.objects.filter(resource=row),
                                                               nowait=True):
            pytest.fail("must not get the lock")
        assert time.monotonic() - started < 0.5  # the holder keeps it for 30 s
        assert caught.value.name == "composition.LockFence"
        # Still usable, and lock_timeout is what it was.
        LockFence.objects.create(resource=f"{row}-after", fence=1)
        assert lock_timeout() == "7s"
    assert LockFence.objects.filter(resource=f"{row}-after").exists()


def test_row_lock_timeout_raises_after_the_timeout_and_restores_lock_timeout(row: str) -> None:
    with row_holder(row), transaction.atomic():
        started = time.monotonic()
        with pytest.raises(LockNotAcquired), row_lock(LockFence.objects.filter(resource=row), timeout_s=0.3):
            pass
        elapsed = time.monotonic() - started
        assert 0.3 <= elapsed <= 0.3 + 0.5
        assert lock_timeout() == "0"
        assert LockFence.objects.filter(resource=row).count() == 1
    sample = REGISTRY.get_sample_value("composition_lock_acquire_total",
                                       {"kind": "row", "name": "composition.LockFence", "outcome": "busy"})
    assert sample and sample >= 1


def test_row_lock_acquires_yields_rows_and_restores_lock_timeout(row: str) -> None:
    with transaction.atomic(), row_lock(LockFence.objects.filter(resource=row), timeout_s=1) as rows:
        assert [r.resource for r in rows] == [row]
        assert lock_timeout() == "0"
        LockFence.objects.filter(resource=row).update(fence=5)
    assert LockFence.objects.get(resource=row).fence == 5


def _lock_statements(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if "FOR UPDATE" in q["sql"]]


def test_a_timed_row_lock_is_one_round_trip_first_in_a_transaction_or_not(row: str) -> None:
    # First statement of the transaction: nothing to protect, so no savepoint at all.
    with CaptureQueriesContext(connection) as queries, transaction.atomic(), \
            row_lock(LockFence.objects.filter(resource=row), timeout_s=1) as rows:
        assert [r.resource for r in rows] == [row]
    assert [q["sql"] for q in queries.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")] == \
        _lock_statements(queries)
    assert len(_lock_statements(queries)) == 1 and "SAVEPOINT" not in _lock_statements(queries)[0]
    # After other work: the savepoint, the timeout and the lock still go out as one statement.
    with transaction.atomic():
        LockFence.objects.filter(resource=row).update(fence=2)
        with CaptureQueriesContext(connection) as queries, \
                row_lock(LockFence.objects.filter(resource=row), timeout_s=1) as rows:
            assert [r.fence for r in rows] == [2]
        assert len(queries.captured_queries) == 1 and "SAVEPOINT" in queries.captured_queries[0]["sql"]
        assert lock_timeout() == "0"


def test_a_timed_out_first_lock_leaves_the_transaction_usable(row: str) -> None:
    ran: list[str] = []
    with row_holder(row), transaction.atomic():
        transaction.on_commit(lambda: ran.append("hook"))  # registered before the failed lock
        with pytest.raises(LockNotAcquired), row_lock(LockFence.objects.filter(resource=row), timeout_s=0.2):
            pytest.fail("must not get the lock")
        assert lock_timeout() == "0"
        LockFence.objects.create(resource=f"{row}-after", fence=1)
    assert LockFence.objects.filter(resource=f"{row}-after").exists()
    assert ran == ["hook"]


def test_a_timed_out_lock_after_other_work_keeps_that_work_and_the_callers_lock_timeout(row: str) -> None:
    with row_holder(row), transaction.atomic():
        LockFence.objects.create(resource=f"{row}-before", fence=1)
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '9s'")
        with pytest.raises(LockNotAcquired) as caught, \
                row_lock(LockFence.objects.filter(resource=row), timeout_s=0.2):
            pytest.fail("must not get the lock")
        assert "within 0.2s" in str(caught.value)
        assert lock_timeout() == "9s"
        LockFence.objects.create(resource=f"{row}-after", fence=1)
    assert set(LockFence.objects.filter(resource__startswith=f"{row}-").values_list("resource", flat=True)) == \
        {f"{row}-before", f"{row}-after"}


def test_a_timed_row_lock_restores_the_callers_lock_timeout_when_it_gets_the_lock(row: str) -> None:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '9s'")
        with row_lock(LockFence.objects.filter(resource=row), timeout_s=0.5) as rows:
            assert len(rows) == 1
            assert lock_timeout() == "9s"


@pytest.mark.parametrize("first", [True, False], ids=["first-statement", "after-other-work"])
def test_a_failing_locking_query_leaves_the_transaction_usable(row: str, first: bool) -> None:
    with transaction.atomic():
        if not first:
            LockFence.objects.create(resource=f"{row}-before", fence=1)
        broken = LockFence.objects.extra(where=["1/0 = 1"])  # division by zero, at the server
        with pytest.raises(DataError), row_lock(broken, timeout_s=1):
            pytest.fail("must not get the lock")
        assert lock_timeout() == "0"
        LockFence.objects.create(resource=f"{row}-after", fence=1)
    assert LockFence.objects.filter(resource__startswith=f"{row}-").count() == (1 if first else 2)


def test_row_lock_skip_locked_yields_only_free_rows(row: str) -> None:
    free = unique("lk")
    LockFence.objects.create(resource=free, fence=1)
    with row_holder(row), transaction.atomic(), \
            row_lock(LockFence.objects.filter(resource__in=[row, free]), skip_locked=True) as rows:
        assert [r.resource for r in rows] == [free]


def test_row_lock_of_an_instance_says_to_pass_a_queryset(row: str) -> None:
    # It was "AttributeError: 'LockFence' object has no attribute 'model'".
    instance = LockFence.objects.get(resource=row)
    says = r"row_lock takes a QuerySet .* e\.g\. LockFence\.objects\.filter\(pk=\.\.\.\)"
    with pytest.raises(TypeError, match=says), transaction.atomic(), row_lock(instance):  # type: ignore[arg-type]
        pass
    # A manager is its every row, as before the check.
    with transaction.atomic(), row_lock(LockFence.objects) as rows:  # type: ignore[arg-type]
        assert row in {fence.resource for fence in rows}


def test_row_lock_needs_a_transaction(row: str) -> None:
    with pytest.raises(TransactionRequired, match=r"transaction\.atomic"), \
            row_lock(LockFence.objects.filter(resource=row)):
        pass
    with pytest.raises(ValueError), transaction.atomic(), \
            row_lock(LockFence.objects.all(), nowait=True, skip_locked=True):
        pass
    # 1e10 was PostgreSQL's DataError (lock_timeout out of range); nan and inf raised deep inside.
    for timeout_s in (1e10, float("nan"), float("inf"), -1):
        with pytest.raises(ValueError, match="timeout_s must be a number of seconds from 0"), \
                transaction.atomic(), row_lock(LockFence.objects.filter(resource=row), timeout_s=timeout_s):
            pass
        with pytest.raises(ValueError, match="timeout_s must be a number of seconds from 0"), \
                transaction.atomic(), advisory_lock("t", row, timeout_s=timeout_s):
            pass


# A second process: takes the advisory lock, reports, then on a stdin command either finishes
# the transaction normally or raises inside it; it stays alive afterwards, so only the end of the
# transaction (not the end of the session) can have released the lock.
HOLDER = """
import sys
import django
django.setup()
from django.db import transaction
from composition.locks import advisory_key, advisory_lock

namespace, key = sys.argv[1], sys.argv[2]
print(advisory_key(namespace, key), flush=True)
try:
    with transaction.atomic(), advisory_lock(namespace, key):
        print("locked", flush=True)
        if sys.stdin.readline().strip() == "raise":
            raise RuntimeError("body failed")
except RuntimeError:
    pass
print("ended", flush=True)
sys.stdin.readline()
"""


class AdvisoryHolder:
    def __init__(self, namespace: str, key: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", HOLDER, namespace, key], env=subprocess_env(),
                                        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None and self.process.stdin is not None
        self.key_in_child = int(self.process.stdout.readline())
        assert self.process.stdout.readline().strip() == "locked"

    def end_transaction(self, how: str) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{how}\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == "ended"

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


@pytest.mark.parametrize("how", ["commit", "raise"])
def test_advisory_lock_across_two_processes(how: str) -> None:
    namespace, key = "invoice", unique("lk")
    holder = AdvisoryHolder(namespace, key)
    try:
        assert holder.key_in_child == advisory_key(namespace, key)  # stable across processes
        for timeout_s in (0.2, 0.5):
            with transaction.atomic():
                started = time.monotonic()
                with pytest.raises(LockNotAcquired) as caught, advisory_lock(namespace, key, timeout_s=timeout_s):
                    pass
                elapsed = time.monotonic() - started
                assert timeout_s <= elapsed <= timeout_s + 0.1, elapsed
                assert caught.value.name == f"{namespace}:{key}"
                assert lock_timeout() == "0"
                LockFence.objects.create(resource=f"{key}-{timeout_s}", fence=1)  # still usable
        with transaction.atomic(), pytest.raises(LockNotAcquired), advisory_lock(namespace, key, timeout_s=0):
            pass
        holder.end_transaction(how)
        with transaction.atomic(), advisory_lock(namespace, key, timeout_s=0):
            pass
    finally:
        holder.close()


def test_advisory_lock_is_released_when_the_body_raises_in_this_process() -> None:
    namespace, key = "order", unique("lk")
    with pytest.raises(RuntimeError), transaction.atomic(), advisory_lock(namespace, key):
        raise RuntimeError("body failed")
    got = threading.Event()

    def other() -> None:
        try:
            with transaction.atomic(), advisory_lock(namespace, key, timeout_s=0):
                got.set()
        finally:
            connections.close_all()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(10)
    assert got.is_set()


def test_advisory_lock_is_held_until_the_transaction_ends_not_the_block() -> None:
    namespace, key = "order", unique("lk")
    outcome: list[str] = []

    def other() -> None:
        try:
            with transaction.atomic(), advisory_lock(namespace, key, timeout_s=0):
                outcome.append("acquired")
        except LockNotAcquired:
            outcome.append("busy")
        finally:
            connections.close_all()

    with transaction.atomic():
        with advisory_lock(namespace, key):
            pass
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(10)
    assert outcome == ["busy"]


def test_shared_advisory_locks_coexist_and_exclude_an_exclusive_one() -> None:
    namespace, key = "report", unique("lk")
    results: list[str] = []

    def other(shared: bool) -> None:
        try:
            with transaction.atomic(), advisory_lock(namespace, key, timeout_s=0, shared=shared):
                results.append("acquired")
        except LockNotAcquired:
            results.append("busy")
        finally:
            connections.close_all()

    with transaction.atomic(), advisory_lock(namespace, key, shared=True):
        for shared in (True, False):
            thread = threading.Thread(target=other, args=(shared,))
            thread.start()
            thread.join(10)
    assert results == ["acquired", "busy"]


@pytest.mark.parametrize("kind", ["row", "advisory"])
def test_a_timeout_longer_than_the_statement_timeout_ends_there_with_lock_not_acquired(row: str, kind: str) -> None:
    # The default DB_STATEMENT_TIMEOUT_S is 30 s and timeout_s may be up to a day: the statement
    # timeout cancelled the wait with an OperationalError that callers catching LockNotAcquired
    # turned into a 500.
    holder = row_holder(row) if kind == "row" else advisory_holder("t", row)
    with holder, transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = '300ms'")
        started = time.monotonic()
        with pytest.raises(LockNotAcquired, match="statement_timeout"):
            if kind == "row":
                with row_lock(LockFence.objects.filter(resource=row), timeout_s=5):
                    pass
            else:
                with advisory_lock("t", row, timeout_s=5):
                    pass
        assert time.monotonic() - started < 2.0
        LockFence.objects.create(resource=f"{row}-after", fence=1)  # the transaction is usable
        assert lock_timeout() == "0"
    assert LockFence.objects.filter(resource=f"{row}-after").exists()


def test_row_lock_refuses_nowait_with_a_timeout(row: str) -> None:
    with pytest.raises(ValueError, match="nowait"), transaction.atomic(), \
            row_lock(LockFence.objects.filter(resource=row), nowait=True, timeout_s=5):
        pass


# A project whose router sends reads to a second alias ("replica", here the same database on its
# own connection): the lock is a write, so it runs on the router's database for writes.
ROUTED_CHILD = """
import json, sys
import tests.settings as project_settings
project_settings.DATABASES["default"]["NAME"] = sys.argv[1]
project_settings.DATABASES["replica"] = {**project_settings.DATABASES["default"]}

class ReadsFromTheReplica:
    def db_for_read(self, model, **hints):
        return "replica"
    def db_for_write(self, model, **hints):
        return "default"

project_settings.DATABASE_ROUTERS = [ReadsFromTheReplica()]
import django
django.setup()
from django.db import connections, transaction
from composition.locks import LockNotAcquired, row_lock
from composition.locks.models import LockFence

resource = sys.argv[2]
outcome = {}
with transaction.atomic():
    with row_lock(LockFence.objects.filter(resource=resource), nowait=True) as rows:
        outcome["rows"] = [r.resource for r in rows]
        # The lock is held on "default": another connection cannot take it.
        with transaction.atomic(using="replica"):
            try:
                with row_lock(LockFence.objects.using("replica").filter(resource=resource), nowait=True):
                    outcome["second"] = "acquired"
            except LockNotAcquired:
                outcome["second"] = "busy"
print(json.dumps(outcome))
connections.close_all()
"""


def test_row_lock_takes_the_lock_on_the_routers_database_for_writes(row: str) -> None:
    child = subprocess.run([sys.executable, "-c", ROUTED_CHILD, connection.settings_dict["NAME"], row],
                           env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.settings"), cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr[-3000:]
    assert json.loads(child.stdout.strip().splitlines()[-1]) == {"rows": [row], "second": "busy"}


def test_advisory_lock_needs_a_transaction() -> None:
    with pytest.raises(TransactionRequired), advisory_lock("x", 1):
        pass


def test_advisory_key_is_a_stable_signed_64_bit_value() -> None:
    assert advisory_key("invoice", 42) == advisory_key("invoice", "42")
    assert advisory_key("invoice", 42) != advisory_key("invoic", "e42")
    # Pinned: a changed derivation would let old and new processes hold "the same" lock at once.
    assert advisory_key("invoice", 42) == 841419375882707100
    assert all(-(2**63) <= advisory_key("n", i) < 2**63 for i in range(100))


@pytest.mark.parametrize(("namespace", "key", "error"), [
    ("", 1, ValueError), (None, 1, ValueError), ("a\x1fb", "c", ValueError),
    ("ns", None, TypeError), ("ns", True, TypeError), ("ns", 1.5, TypeError), ("ns", "", ValueError),
    ("ns", LockFence(resource="r", fence=1), TypeError),
])
def test_advisory_lock_refuses_a_key_that_would_name_a_lock_by_accident(namespace: object, key: object,
                                                                       error: type[Exception]) -> None:
    with pytest.raises(error), transaction.atomic(), advisory_lock(namespace, key):  # type: ignore[arg-type]
        pass
