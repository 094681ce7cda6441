"""Every PostgreSQL connection gets short statement and idle-in-transaction timeouts."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import OperationalError, connection, transaction
from django.test import override_settings

from composition.testing import current_database_url, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _show(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SHOW {name}")
        return str(cursor.fetchone()[0])


def test_session_timeouts_come_from_settings() -> None:
    connection.close()
    with override_settings(COMPOSITION={"DB_STATEMENT_TIMEOUT_S": 1.5, "DB_IDLE_IN_TRANSACTION_TIMEOUT_S": 7}):
        connection.ensure_connection()
        assert _show("statement_timeout") == "1500ms"
        assert _show("idle_in_transaction_session_timeout") == "7s"
    connection.close()


def test_a_slow_statement_is_cancelled() -> None:
    connection.close()
    with override_settings(COMPOSITION={"DB_STATEMENT_TIMEOUT_S": 0.2}), \
            pytest.raises(OperationalError, match="statement timeout"), transaction.atomic(), \
            connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(2)")
    connection.close()


def test_stopping_closes_every_threads_connection_not_only_the_stoppers() -> None:
    from composition.lifecycle.components import DatabaseComponent

    # Worker-like threads each open a connection and stay alive, as Dramatiq's threads do.
    backend_pids: list[int] = []
    opened, release = threading.Barrier(4), threading.Event()

    def worker() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend_pids.append(cursor.fetchone()[0])
        opened.wait()
        release.wait()

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    opened.wait()
    try:
        assert _open_backends(backend_pids) == set(backend_pids)
        DatabaseComponent().stop(5.0)
        # A closed connection's server process ends a moment after the client hangs up.
        wait_until(lambda: _open_backends(backend_pids) == set(), 5,
                   message=f"connections still open: {_open_backends(backend_pids)}")
    finally:
        release.set()
        for thread in threads:
            thread.join()


def _open_backends(pids: list[int]) -> set[int]:
    with psycopg.connect(current_database_url(), autocommit=True) as observer:
        rows = observer.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]).fetchall()
    return {row[0] for row in rows}
