"""The inbox ledger's INSERT: with the transaction's BEGIN in one round trip when it is the
transaction's first statement, through the ordinary cursor otherwise; same answers either way."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from psycopg import IsolationLevel
from structlog.testing import capture_logs

from composition.jobs.inbox import record_processed
from composition.jobs.models import ProcessedMessage
from composition.testing import current_database_url


def _slow_query_sql(logs: Iterable[Mapping[str, Any]]) -> list[str]:
    return [str(entry["sql"]) for entry in logs
            if entry.get("event") == "slow query" and 'INSERT INTO "composition_processedmessage"' in str(entry["sql"])]


@pytest.mark.django_db(transaction=True)
def test_the_ledger_row_is_timed_and_logged_without_its_parameters() -> None:
    with override_settings(COMPOSITION={**settings.COMPOSITION, "DB_SLOW_QUERY_S": 1e-9}), capture_logs() as logs:
        with transaction.atomic():
            assert record_processed("timed-first", "charge") is True
        with transaction.atomic():
            ProcessedMessage.objects.exists()
            assert record_processed("timed-later", "charge") is True
        with transaction.atomic():
            assert record_processed("timed-first", "charge") is False
    ledger = _slow_query_sql(logs)
    assert len(ledger) == 3 and all(sql.startswith("INSERT INTO") for sql in ledger), ledger
    assert "timed-first" not in ledger[0], "the logged SQL carries no parameters"
    assert set(ProcessedMessage.objects.values_list("message_id", flat=True)) == {"timed-first", "timed-later"}


@pytest.mark.django_db(transaction=True)
def test_query_logging_sees_the_ledger_statement() -> None:
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        assert record_processed("logged", "charge") is True
    assert [query["sql"] for query in queries if "composition_processedmessage" in query["sql"]]


@pytest.mark.django_db(transaction=True)
def test_the_transaction_keeps_the_connections_isolation_level() -> None:
    connection.ensure_connection()
    raw: Any = connection.connection
    previous = raw.isolation_level
    raw.isolation_level = IsolationLevel.SERIALIZABLE
    try:
        with transaction.atomic():
            assert record_processed("serializable", "charge") is True
            with connection.cursor() as cursor:
                cursor.execute("SHOW transaction_isolation")
                assert cursor.fetchone()[0] == "serializable"
    finally:
        raw.isolation_level = previous


@pytest.mark.django_db(transaction=True)
def test_a_failed_ledger_statement_raises_djangos_error_and_rolls_back() -> None:
    """A redelivery that waits on the first delivery's row past its statement timeout: Django's
    OperationalError, nothing written, and the connection still serves the next job."""
    with psycopg.connect(current_database_url()) as first:
        first.execute("INSERT INTO composition_processedmessage (message_id, actor, processed_at)"
                      " VALUES ('held', 'charge', now())")  # uncommitted: the row's lock is held
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('statement_timeout'),"
                           " set_config('statement_timeout', '200ms', false)")
            previous = cursor.fetchone()[0]
        try:
            with pytest.raises(OperationalError, match="statement timeout"), transaction.atomic():
                record_processed("held", "charge")
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('statement_timeout', %s, false)", [previous])
        first.rollback()
    assert not connection.needs_rollback
    with transaction.atomic():
        assert record_processed("held", "charge") is True
    assert ProcessedMessage.objects.filter(message_id="held").count() == 1
