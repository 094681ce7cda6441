"""Every PostgreSQL connection gets short statement and idle-in-transaction timeouts."""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection, transaction
from django.test import override_settings

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
