"""Rows held and sent with the next statement or COMMIT (composition.deferred_writes, on the
composition backend the tests' settings use): fewer round trips, the same atomicity."""

from __future__ import annotations

import os
import uuid

import pytest
from django.db import IntegrityError, connection, transaction

from composition.cache import invalidate
from composition.cache.models import PendingInvalidation
from composition.deferred_writes import _id_blocks, can_hold, hold, reserve_id
from composition.testing import after_commit_done
from tests.outboxapp.models import Order
from tests.pgtrace import sent_queries

ORDER_TABLE = Order._meta.db_table


def _hold_order(reference: str) -> None:
    assert can_hold(connection)
    hold(connection, f"INSERT INTO {ORDER_TABLE} (reference) VALUES (%s)", [reference])


def _references() -> list[str]:
    return sorted(Order.objects.values_list("reference", flat=True))


@pytest.mark.django_db(transaction=True)
def test_invalidation_records_go_with_commit_in_one_string() -> None:
    ns = uuid.uuid4().hex[:8]
    with transaction.atomic():  # a block of ids reserved first: the count below is the steady state
        Order.objects.create(reference="warm")
        invalidate(f"{ns}:warm")
    after_commit_done()
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


@pytest.mark.django_db(transaction=True)
def test_reserved_ids_are_distinct_and_a_forked_child_holds_none_of_its_parents() -> None:
    with transaction.atomic():
        Order.objects.create(reference="A")
        ids = [reserve_id(connection, PendingInvalidation) for _ in range(120)]  # across blocks
    assert len(set(ids)) == 120
    assert _id_blocks.blocks
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.write(write, b"empty" if not _id_blocks.blocks else b"kept")
        os._exit(0)
    os.waitpid(child, 0)
    assert os.read(read, 16) == b"empty"
