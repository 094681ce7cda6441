"""The after-commit thread (composition.background): batches, flush, failures, idle exit; and
what it takes off the request path: a pay's request answers after its COMMIT without another
statement on its connection, while the outbox row is sent and marked sent, and the
invalidation record deleted, on the after-commit thread."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections
from prometheus_client import REGISTRY

from billing.models import Invoice
from billing.wiring import default_service
from composition import background
from composition.background import Batcher
from composition.cache.models import PendingInvalidation
from composition.outbox import OutboxMessage
from composition.testing import after_commit_done, wait_until
from tests.pgtrace import sent_queries


def test_items_handed_in_while_a_round_runs_are_handled_together_in_order() -> None:
    gate = threading.Event()
    rounds: list[list[int]] = []

    def handle(items: list[int]) -> None:
        rounds.append(items)
        gate.wait(5)

    batcher = Batcher("test-batches")
    batcher.submit(handle, 0)
    wait_until(lambda: rounds, timeout_s=5)
    for item in range(1, 6):  # the thread is busy with item 0
        batcher.submit(handle, item)
    assert batcher.pending() == 6
    gate.set()
    assert batcher.flush(5)
    assert rounds == [[0], [1, 2, 3, 4, 5]]
    assert batcher.pending() == 0


def test_each_handler_gets_its_own_items_once_per_round() -> None:
    gate = threading.Event()
    seen: dict[str, list[list[str]]] = {"a": [], "b": []}

    blocking = threading.Event()

    def blocker(items: list[str]) -> None:
        blocking.set()
        gate.wait(5)

    def handle_a(items: list[str]) -> None:
        seen["a"].append(items)

    def handle_b(items: list[str]) -> None:
        seen["b"].append(items)

    batcher = Batcher("test-handlers")
    batcher.submit(blocker, "x")
    assert blocking.wait(5)
    for item in ("a1", "b1", "a2", "b2"):
        batcher.submit(handle_a if item.startswith("a") else handle_b, item)
    gate.set()
    assert batcher.flush(5)
    assert seen == {"a": [["a1", "a2"]], "b": [["b1", "b2"]]}


def test_a_failing_handler_drops_its_items_and_the_others_and_later_rounds_still_run() -> None:
    done: list[str] = []

    def fails(items: list[str]) -> None:
        raise RuntimeError("broken bookkeeping")

    batcher = Batcher("test-failure")
    batcher.submit(fails, "lost")
    batcher.submit(done.extend, "kept")
    assert batcher.flush(5)
    batcher.submit(done.extend, "later")
    assert batcher.flush(5)
    assert done == ["kept", "later"]


def test_a_child_forked_while_the_thread_held_the_batchers_lock_still_hands_work_in() -> None:
    # A fork (a preloading server's master starting its workers) may come while the parent's
    # thread holds the batcher's lock for a moment: the child inherits the lock held, by a
    # thread it does not have, and would hang on its first submit.
    batcher = Batcher("test-fork")
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with batcher._cond:  # type: ignore[attr-defined]
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    assert held.wait(5)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only the batcher and the pipe, then out without Python's exit
        try:
            signal.alarm(5)  # hung on the inherited lock: die rather than hang the test
            handled: list[str] = []
            batcher.submit(handled.extend, "child")
            os.write(write_end, f"{batcher.flush(5)} {','.join(handled)}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    release.set()
    holder.join()
    try:
        answer = os.read(read_end, 100).decode()
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    assert answer == "True child", answer
    batcher.submit(lambda items: None, "parent")  # and the parent's batcher is as it was
    assert batcher.flush(5) and batcher.stop(5)


def test_flush_times_out_while_a_round_is_stuck_and_succeeds_after() -> None:
    gate = threading.Event()
    batcher = Batcher("test-stuck")
    batcher.submit(lambda items: gate.wait(5), 1)
    started = time.monotonic()
    assert batcher.flush(0.2) is False
    assert 0.15 < time.monotonic() - started < 2
    gate.set()
    assert batcher.flush(5)



def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_after_commit_metrics_show_the_backlog_each_round_and_each_failed_batch() -> None:
    assert background.flush(5)  # the process's own thread idle, so only this batcher moves them
    backlog, rounds = "composition_after_commit_backlog_items", "composition_after_commit_round_seconds_count"
    backlog_before, rounds_before = _sample(backlog), _sample(rounds)
    gate, started = threading.Event(), threading.Event()

    def stuck(items: list[int]) -> None:
        started.set()
        gate.wait(5)

    def fails(items: list[int]) -> None:
        raise RuntimeError("broken bookkeeping")

    batcher = Batcher("test-metrics", exports_metrics=True)
    batcher.submit(stuck, 1)
    assert started.wait(5)
    for item in (2, 3, 4):  # waiting behind the stuck round, which counts until it ends
        batcher.submit(fails, item)
    assert _sample(backlog) - backlog_before == 4
    failures_before = _sample("composition_after_commit_failures_total", handler=fails.__qualname__)
    gate.set()
    assert batcher.flush(5)
    assert _sample(backlog) == backlog_before
    assert _sample(rounds) - rounds_before == 2
    # One failed batch of three items, counted once, by the handler's name.
    assert _sample("composition_after_commit_failures_total", handler=fails.__qualname__) - failures_before == 1
    assert batcher.stop(5)


@pytest.mark.django_db(transaction=True)
def test_the_thread_ends_when_idle_and_closes_its_database_connection() -> None:
    pids: list[int] = []

    def uses_database(items: list[int]) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pids.append(cursor.fetchone()[0])

    batcher = Batcher("test-idle", idle_exit_s=0.2)
    batcher.submit(uses_database, 1)
    assert batcher.flush(5)
    wait_until(lambda: batcher._thread is None, timeout_s=5)

    def backend_alive() -> bool:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pids[0]])
            return bool(cursor.fetchone()[0])

    wait_until(lambda: not backend_alive(), timeout_s=5)
    batcher.submit(uses_database, 2)  # a new thread, a new connection
    assert batcher.flush(5)
    assert len(pids) == 2


@pytest.mark.django_db(transaction=True)
def test_a_round_after_the_database_dropped_the_threads_connection_connects_afresh() -> None:
    pids: list[int] = []
    failures: list[str] = []

    def uses_database(items: list[int]) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pids.append(cursor.fetchone()[0])
        except DatabaseError as exc:  # as the outbox's and the cache's handlers do: logged, left to repair
            failures.append(type(exc).__name__)

    batcher = Batcher("test-reconnect", idle_exit_s=30)
    batcher.submit(uses_database, 1)
    assert batcher.flush(5)
    with connections["default"].cursor() as cursor:  # as a database restart or failover would
        cursor.execute("SELECT pg_terminate_backend(%s)", [pids[0]])
    batcher.submit(uses_database, 2)  # this round finds the connection broken...
    assert batcher.flush(5)
    batcher.submit(uses_database, 3)  # ...and the next one connects afresh
    assert batcher.stop(5)
    assert failures == ["OperationalError"], (failures, pids)
    assert len(pids) == 2 and pids[1] != pids[0]


@pytest.mark.django_db(transaction=True)
def test_a_pay_sends_its_transaction_and_nothing_after_commit_from_the_request() -> None:
    invoice = Invoice.objects.create(number=f"BG-{uuid.uuid4().hex[:8]}", customer="Ada", amount_cents=500)
    service = default_service()
    after_commit_done()
    with sent_queries() as queries:
        outcome = service.pay_invoice(invoice.pk, payment_id=f"bg-{invoice.pk}", amount_cents=500)
    # BEGIN, the lock, the payment, the invoice's update, the outbox row, the invalidation
    # record and COMMIT: plain statements, and none after COMMIT on the request's connection.
    assert [query.split()[0] for query in queries] == ["BEGIN", "SELECT", "INSERT", "UPDATE", "INSERT", "INSERT",
                                                        "COMMIT"], queries
    assert "FOR UPDATE" in queries[1] and 'INSERT INTO "billing_payment"' in queries[2], queries
    assert 'INSERT INTO "composition_outboxmessage"' in queries[4], queries
    message = OutboxMessage.objects.get(payload__payment_id=outcome.payment.pk)
    # ...while the after-commit thread sends the row and marks it sent, and deletes the record.
    after_commit_done()
    message.refresh_from_db()
    assert message.status == OutboxMessage.Status.SENT
    assert not PendingInvalidation.objects.filter(target=f"invoice:{invoice.pk}").exists()
    assert message.attempts == 1  # sent once, by this process: nothing was left to the sweep


@pytest.mark.django_db  # the test runs inside a transaction: its on-commit hooks run inside it
def test_hooks_run_inside_an_enclosing_transaction_do_their_bookkeeping_on_the_calling_thread(
        django_capture_on_commit_callbacks: Any) -> None:
    invoice = Invoice.objects.create(number=f"BG-{uuid.uuid4().hex[:8]}", customer="Ada", amount_cents=500)
    with django_capture_on_commit_callbacks(execute=True):
        outcome = default_service().pay_invoice(invoice.pk, payment_id=f"in-{invoice.pk}", amount_cents=500)
    # No after_commit_done(): the after-commit thread, on its own connection, could not even see
    # these uncommitted rows, so the hooks did the work here, on this connection.
    message = OutboxMessage.objects.get(payload__payment_id=outcome.payment.pk)
    assert (message.status, message.attempts) == (OutboxMessage.Status.SENT, 1)
    assert not PendingInvalidation.objects.filter(target=f"invoice:{invoice.pk}").exists()
