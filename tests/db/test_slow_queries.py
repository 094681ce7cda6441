"""Slow queries against real PostgreSQL: a query over ``DB_SLOW_QUERY_S`` is counted per alias
and logged with its SQL (cut, never its parameters), a failed one too; none is timed when the
threshold is None; and every connection keeps the timer, however it was opened."""

from __future__ import annotations

import threading
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.db import OperationalError, connection, connections, transaction
from django.test import override_settings
from structlog.testing import capture_logs

from composition.db.slow_queries import MAX_SQL_CHARS, time_query
from composition.testing import metric_value

pytestmark = pytest.mark.django_db

# Far above what a quick query takes on a loaded machine, far below what pg_sleep makes it take.
THRESHOLD_S = 0.25
SLOW_S = 0.4


def _slow_queries() -> float:
    return metric_value("composition_db_slow_queries_total", alias="default")


@contextmanager
def _threshold(threshold_s: float | None) -> Iterator[list[MutableMapping[str, Any]]]:
    """``DB_SLOW_QUERY_S`` for the block; the slow-query log lines written in it."""
    with override_settings(COMPOSITION={**settings.COMPOSITION, "DB_SLOW_QUERY_S": threshold_s}), \
            capture_logs() as logs:
        slow: list[MutableMapping[str, Any]] = []
        yield slow
    slow += [entry for entry in logs if entry["event"] == "slow query"]


def test_a_slow_query_is_counted_and_logged_with_its_sql_but_never_its_parameters() -> None:
    before = _slow_queries()
    with _threshold(THRESHOLD_S) as logged, connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(%s), %s", [SLOW_S, "secret@example.invalid"])
        cursor.execute("SELECT 1")  # quick: neither counted nor logged
    assert _slow_queries() - before == 1
    [entry] = logged
    assert entry["sql"] == "SELECT pg_sleep(%s), %s"
    assert "secret@example.invalid" not in str(entry)
    assert entry["alias"] == "default" and entry["threshold_s"] == THRESHOLD_S and entry["many"] is False
    assert SLOW_S <= entry["duration_s"] < SLOW_S + 5
    assert entry["log_level"] == "warning"


def test_a_query_that_failed_after_the_threshold_counts_too() -> None:
    before = _slow_queries()
    with _threshold(THRESHOLD_S) as logged, pytest.raises(OperationalError), transaction.atomic(), \
            connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL statement_timeout = {int(SLOW_S * 1000)}")
        cursor.execute("SELECT pg_sleep(5)")  # cancelled by the statement timeout: the time was spent
    assert _slow_queries() - before == 1
    assert [entry["sql"] for entry in logged] == ["SELECT pg_sleep(5)"]


def test_a_long_statement_is_logged_cut_and_executemany_says_so() -> None:
    padding = "x" * (2 * MAX_SQL_CHARS)
    with _threshold(THRESHOLD_S) as logged, connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_sleep({SLOW_S}) /* {padding} */")
        cursor.executemany("SELECT pg_sleep(%s)", [(SLOW_S / 2,), (SLOW_S / 2,)])
    long, many = logged
    assert long["sql"] == f"SELECT pg_sleep({SLOW_S}) /* {padding}"[:MAX_SQL_CHARS]
    assert (many["sql"], many["many"]) == ("SELECT pg_sleep(%s)", True)


def test_with_no_threshold_nothing_is_timed() -> None:
    before = _slow_queries()
    with _threshold(None) as logged, connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(%s)", [SLOW_S])
    assert (_slow_queries() - before, logged) == (0, [])


@pytest.mark.django_db(transaction=True)  # it closes the connection
def test_a_reconnected_connection_keeps_one_timer_first() -> None:
    connection.close()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    connection.close()
    connection.ensure_connection()
    assert connection.execute_wrappers.count(time_query) == 1
    assert connection.execute_wrappers[0] is time_query


def test_a_connection_opened_inside_an_execute_wrapper_block_keeps_the_slow_query_timer() -> None:
    seen: list[list[Any]] = []

    def other_thread() -> None:
        connection = connections["default"]  # this thread's own, not yet connected
        try:
            # The cursor connects inside the block: connection_created fires there.
            with connection.execute_wrapper(lambda execute, *args: execute(*args)), connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            seen.append(list(connection.execute_wrappers))
        finally:
            connection.close()

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert seen == [[time_query]]
