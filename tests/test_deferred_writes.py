"""Rows held and sent with the next statement or COMMIT (composition.deferred_writes, on the
composition backend the tests' settings use): fewer round trips, the same atomicity, and outbox
rows published without a row back still in publish order."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction

from composition.cache import invalidate
from composition.cache.models import PendingInvalidation
from composition.deferred_writes import can_hold, hold
from composition.locks import LockNotAcquired, row_lock
from composition.outbox import OutboxMessage, publish
from composition.testing import after_commit_done, current_database_url
from tests.outboxapp.helpers import enqueued, flush_broker
from tests.outboxapp.models import Order
from tests.pgtrace import sent_queries

ORDER_TABLE = Order._meta.db_table
PROBE = "outboxapp_relay_probe"
PROBE_QUEUE = "outboxapp_probe"


def _hold_order(reference: str) -> None:
    assert can_hold(connection)
    hold(connection, f"INSERT INTO {ORDER_TABLE} (reference) VALUES (%s)", [reference])


def _references() -> list[str]:
    return sorted(Order.objects.values_list("reference", flat=True))


@pytest.mark.django_db(transaction=True)
def test_invalidation_records_go_with_commit_in_one_string() -> None:
    ns = uuid.uuid4().hex[:8]
    with sent_queries() as queries, transaction.atomic():
        Order.objects.create(reference="A")
        invalidate(f"{ns}:1")
        invalidate(f"{ns}:2")
    # psycopg's BEGIN, the order, then both records with COMMIT.
    assert len(queries) == 3, queries
    assert queries[0] == "BEGIN" and queries[1].startswith(f'INSERT INTO "{ORDER_TABLE}"')
    assert queries[2].count(f'INSERT INTO "{PendingInvalidation._meta.db_table}"') == 2, queries[2]
    assert queries[2].endswith("; COMMIT")


@pytest.mark.django_db(transaction=True)
def test_a_read_in_the_transaction_sees_a_held_row() -> None:
    with transaction.atomic():
        Order.objects.create(reference="A")
        _hold_order("held")
        assert connection.held_writes  # type: ignore[attr-defined]
        assert Order.objects.filter(reference="held").exists()
        assert not connection.held_writes  # type: ignore[attr-defined]


@pytest.mark.django_db(transaction=True)
def test_held_rows_roll_back_with_their_transaction_and_the_next_one_does_not_send_them() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        Order.objects.create(reference="A")
        _hold_order("held-1")
        raise RuntimeError
    with transaction.atomic():
        Order.objects.create(reference="B")
        _hold_order("held-2")
    assert _references() == ["B", "held-2"]


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_savepoint_takes_its_held_rows_and_leaves_the_ones_before_it() -> None:
    with transaction.atomic():
        Order.objects.create(reference="A")
        _hold_order("before")
        with pytest.raises(RuntimeError), transaction.atomic():
            _hold_order("inside")
            raise RuntimeError
        _hold_order("after")
    assert _references() == ["A", "after", "before"]


@pytest.mark.django_db(transaction=True)
def test_a_held_insert_that_fails_at_commit_rolls_the_whole_transaction_back_and_raises() -> None:
    taken = Order.objects.create(reference="taken").pk
    with pytest.raises(IntegrityError), transaction.atomic():
        Order.objects.create(reference="lost")
        _hold_order("lost too")
        hold(connection, f"INSERT INTO {ORDER_TABLE} (id, reference) VALUES (%s, 'duplicate')", [taken])
    assert _references() == ["taken"]
    with transaction.atomic():  # the connection works on
        Order.objects.create(reference="next")
        _hold_order("held")
    assert _references() == ["held", "next", "taken"]


@pytest.mark.django_db(transaction=True)
def test_a_held_insert_that_fails_fails_the_statement_it_went_with() -> None:
    taken = Order.objects.create(reference="taken").pk
    with pytest.raises(IntegrityError), transaction.atomic():
        Order.objects.create(reference="lost")
        hold(connection, f"INSERT INTO {ORDER_TABLE} (id, reference) VALUES (%s, 'duplicate')", [taken])
        Order.objects.count()
    assert _references() == ["taken"]


@pytest.mark.django_db(transaction=True)
def test_nothing_is_held_before_the_transaction_reached_the_server_nor_in_autocommit() -> None:
    assert not can_hold(connection)
    with transaction.atomic():
        # The first statement carries psycopg's BEGIN: nothing may go before it.
        assert not can_hold(connection)
        invalidate(f"{uuid.uuid4().hex[:8]}:1")
        assert not connection.held_writes  # type: ignore[attr-defined]
        assert can_hold(connection)


@pytest.fixture
def order_locked_elsewhere() -> Iterator[int]:
    """A committed order whose row another connection holds locked (FOR UPDATE) meanwhile."""
    order = Order.objects.create(reference="busy").pk
    with psycopg.connect(current_database_url()) as other:
        other.execute(f"SELECT 1 FROM {ORDER_TABLE} WHERE id = %s FOR UPDATE", [order])
        yield order
        other.rollback()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("wait", ["nowait", "timeout"])
def test_a_row_lock_after_a_held_row_keeps_its_timeout_and_the_held_row(order_locked_elsewhere: int,
                                                                        wait: str) -> None:
    # The held row goes out before the lock's savepoint: a refused lock takes nothing with it,
    # and the lock statement itself keeps its NOWAIT or lock_timeout.
    options = {"nowait": True} if wait == "nowait" else {"timeout_s": 0.2}
    with transaction.atomic():
        Order.objects.create(reference="A")
        _hold_order("held")
        with pytest.raises(LockNotAcquired), row_lock(Order.objects.filter(pk=order_locked_elsewhere), **options):
            pass
        Order.objects.create(reference="B")  # the transaction is still usable
    assert _references() == ["A", "B", "busy", "held"]


@pytest.mark.django_db(transaction=True)
def test_a_server_side_cursor_after_a_held_row_reads_it() -> None:
    # QuerySet.iterator() reads through a named (server-side) cursor, whose execute is a
    # DECLARE: the held row cannot go on it.
    with transaction.atomic():
        Order.objects.create(reference="A")
        _hold_order("held")
        assert sorted(order.reference for order in Order.objects.iterator(chunk_size=1)) == ["A", "held"]
    assert _references() == ["A", "held"]


@pytest.fixture
def empty_probe_queue() -> Iterator[None]:
    flush_broker()
    yield
    after_commit_done()
    flush_broker()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("empty_probe_queue")
def test_messages_published_without_a_row_go_with_commit_and_leave_in_publish_order() -> None:
    with sent_queries() as queries, transaction.atomic():
        Order.objects.create(reference="A")
        assert publish(PROBE, {"seq": 0}, row=False) is None
        publish(PROBE, {"seq": 1}, key="k")  # a key: inserted at once, after the held row
        publish(PROBE, {"seq": 2}, row=False)
        publish(PROBE, {"seq": 3})  # a row back: inserted at once
        publish(PROBE, {"seq": 4}, row=False)
    outbox = f'INSERT INTO "{OutboxMessage._meta.db_table}"'
    # Each held row goes before the next statement (the keyed INSERT, the one with a row back),
    # the last one with COMMIT.
    assert [query.count(outbox) for query in queries] == [0, 0, 1, 1, 1, 1, 1], queries
    assert queries[-1].endswith("; COMMIT")
    after_commit_done()
    rows = list(OutboxMessage.objects.order_by("id").values_list("payload", "status", "attempts"))
    assert rows == [({"seq": seq}, "sent", 1) for seq in range(5)]  # ids in publish order, each sent once
    assert [message.kwargs["seq"] for message in enqueued(PROBE_QUEUE)] == list(range(5))


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("empty_probe_queue")
def test_a_message_without_a_row_rolls_back_with_its_savepoint_and_the_others_are_sent() -> None:
    with transaction.atomic():
        Order.objects.create(reference="A")
        publish(PROBE, {"seq": 1}, row=False)
        with pytest.raises(RuntimeError), transaction.atomic():
            publish(PROBE, {"seq": 2}, row=False)
            raise RuntimeError
        publish(PROBE, {"seq": 3}, row=False)
    after_commit_done()
    assert sorted(p["seq"] for p in OutboxMessage.objects.values_list("payload", flat=True)) == [1, 3]
    assert sorted(message.kwargs["seq"] for message in enqueued(PROBE_QUEUE)) == [1, 3]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("empty_probe_queue")
def test_a_message_without_a_row_in_a_rolled_back_transaction_is_neither_written_nor_sent() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        Order.objects.create(reference="A")
        publish(PROBE, {"seq": 1}, row=False)
        raise RuntimeError
    after_commit_done()
    assert not OutboxMessage.objects.exists()
    assert enqueued(PROBE_QUEUE) == []


@pytest.mark.django_db(transaction=True)
def test_a_row_callback_failing_after_commit_is_logged_and_the_commit_stands(
        caplog: pytest.LogCaptureFixture) -> None:
    def fails(row: tuple[object, ...]) -> None:
        raise RuntimeError(f"callback bug on row {row[0]}")

    committed: list[str] = []
    with transaction.atomic():
        Order.objects.create(reference="A")
        hold(connection, f"INSERT INTO {ORDER_TABLE} (reference) VALUES (%s) RETURNING id", ["held"], on_row=fails)
        transaction.on_commit(lambda: committed.append("hooks ran"))
    # No exception out of atomic (the transaction has committed), its hooks ran, the failure is logged.
    assert _references() == ["A", "held"]
    assert committed == ["hooks ran"]
    assert "row callback failed after its transaction ended" in caplog.text and "callback bug" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_row_callback_failing_before_commit_raises_and_rolls_back() -> None:
    def fails(row: tuple[object, ...]) -> None:
        raise RuntimeError("callback bug")

    with pytest.raises(RuntimeError, match="callback bug"), transaction.atomic():
        Order.objects.create(reference="A")
        hold(connection, f"INSERT INTO {ORDER_TABLE} (reference) VALUES (%s) RETURNING id", ["held"], on_row=fails)
        Order.objects.count()  # the held row goes with this statement, its callback raises here
    assert _references() == []
