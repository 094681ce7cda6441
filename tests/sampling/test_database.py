"""The database sampler against real PostgreSQL: client connections by state, server-wide (every
state always reported), the usable ceiling as the connection budget reads it, and deadlocks."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection, transaction

from composition.db.budget import server_limits
from composition.sampling.database import CONNECTION_STATES, sample_database
from composition.testing import current_database_url, wait_until
from tests.helpers import unique

# What pg_stat_activity shows, counted independently of the sampler's own query and mapping.
_BY_STATE_SQL = """
SELECT count(*) FILTER (WHERE state = 'active'),
       count(*) FILTER (WHERE state = 'idle'),
       count(*) FILTER (WHERE state IN ('idle in transaction', 'idle in transaction (aborted)')),
       count(*) FILTER (WHERE state IS NULL
                        OR state NOT IN ('active', 'idle', 'idle in transaction', 'idle in transaction (aborted)')),
       count(*)
FROM pg_stat_activity WHERE backend_type = 'client backend'
"""


@pytest.fixture
def sessions() -> Iterator[dict[str, str]]:
    """Four more sessions, one in each state the sampler tells apart; their application_name →
    the state pg_stat_activity should show for it."""
    mark = unique("sampled-")
    expected = {f"{mark}-idle": "idle", f"{mark}-in-transaction": "idle in transaction",
                f"{mark}-aborted": "idle in transaction (aborted)", f"{mark}-untracked": "disabled"}
    opened = [psycopg.connect(current_database_url(), application_name=name, autocommit=True) for name in expected]
    try:
        _idle, in_transaction, aborted, untracked = opened
        for session in (in_transaction, aborted):
            session.execute("BEGIN")
        in_transaction.execute("SELECT 1")
        with pytest.raises(psycopg.errors.DivisionByZero):
            aborted.execute("SELECT 1 / 0")
        untracked.execute("SET track_activities = off")  # its state reads "disabled"
        yield expected
    finally:
        for session in opened:
            session.close()


@pytest.mark.django_db
def test_every_client_connection_of_the_server_is_counted_in_its_state(sessions: dict[str, str]) -> None:
    # One transaction: PostgreSQL shows it one snapshot of pg_stat_activity, taken at its first
    # read, so the sampler and the independent count below see the same sessions.
    with transaction.atomic(), connection.cursor() as cursor:
        sample = sample_database()
        cursor.execute("SELECT application_name, state FROM pg_stat_activity WHERE application_name = ANY(%s)",
                       [list(sessions)])
        assert dict(cursor.fetchall()) == sessions, "the sessions are not in the states the test needs"
        cursor.execute(_BY_STATE_SQL)
        active, idle, idle_in_transaction, other, total = cursor.fetchone()
    # Every state, each reported (at 0 when none is in it) so a dashboard never keeps a state's
    # last value; not checked on its own at 0: this server-wide count is shared with the gate's
    # other shards, whose connections still in their start-up read as "other" (for seconds at times).
    assert list(sample.connections) == list(CONNECTION_STATES)
    assert sample.connections == {"active": active, "idle": idle, "idle_in_transaction": idle_in_transaction,
                                  "other": other}
    assert sample.in_use == total
    assert active >= 1 and idle >= 1 and idle_in_transaction >= 2 and other >= 1


@pytest.mark.django_db
def test_the_usable_ceiling_is_the_one_the_connection_budget_is_checked_against() -> None:
    sample = sample_database()
    assert sample.usable == server_limits().usable
    assert 0 < sample.in_use <= sample.usable + 10  # superusers may use the reserved ones


def _deadlock() -> None:
    """Two sessions each wait for the other's advisory lock; PostgreSQL cancels one of them."""
    first, second = (psycopg.connect(current_database_url()) for _ in range(2))
    try:
        for session in (first, second):
            session.execute("SET deadlock_timeout = '50ms'")
        first.execute("SELECT pg_advisory_xact_lock(1)")
        second.execute("SELECT pg_advisory_xact_lock(2)")
        errors: list[Exception] = []

        def wait_for(session: psycopg.Connection, key: int) -> None:
            try:
                session.execute("SELECT pg_advisory_xact_lock(%s)", [key])
            except psycopg.errors.DeadlockDetected as exc:
                errors.append(exc)
                session.rollback()

        waiters = [threading.Thread(target=wait_for, args=(first, 2)),
                   threading.Thread(target=wait_for, args=(second, 1))]
        for waiter in waiters:
            waiter.start()
        for waiter in waiters:
            waiter.join(10)
        assert len(errors) == 1, errors
    finally:
        # A session reports its statistics at the latest when it ends.
        first.close()
        second.close()


@pytest.mark.django_db(transaction=True)  # each sample its own transaction, as the sampler's: fresh statistics
def test_a_deadlock_in_this_database_is_counted() -> None:
    before = sample_database().deadlocks
    _deadlock()
    wait_until(lambda: sample_database().deadlocks == before + 1, 5,
               message="the deadlock was not counted in this database")
