"""The worker's health check of a reused database connection: no round trip, and a connection the
server ended is replaced before the job's first query."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import close_old_connections, connection

from composition.jobs.connection_hygiene import check_connections
from composition.testing import current_database_url


@pytest.mark.django_db(transaction=True)
def test_a_healthy_connection_is_kept_and_taken_as_checked() -> None:
    connection.ensure_connection()
    raw = connection.connection
    close_old_connections()
    assert connection.health_check_done is False  # type: ignore[attr-defined]
    check_connections()
    assert connection.connection is raw
    assert connection.health_check_done is True  # type: ignore[attr-defined]


@pytest.mark.django_db(transaction=True)
def test_a_connection_the_server_ended_is_replaced() -> None:
    connection.ensure_connection()
    raw = connection.connection
    with psycopg.connect(current_database_url(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [raw.info.backend_pid])
    time.sleep(0.2)  # the server's goodbye reaches the socket
    close_old_connections()
    check_connections()
    assert connection.connection is None
    with connection.cursor() as cursor:  # a fresh one, at once
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
