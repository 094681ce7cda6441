"""``migrate`` runs without the short session timeouts (a long index build or data migration
must not fail); every other connection keeps them, and a block can opt out."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.db import OperationalError, connection, transaction
from django.test import override_settings

from composition.db.timeouts import without_session_timeouts
from composition.testing import subprocess_env
from tests.helpers import ROOT


def _manage(database_url: str, *args: str, hold_s: float, **composition: float) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(DATABASE_URL=database_url, DJANGO_SETTINGS_MODULE="tests.settings_slow_migration",
                         SLOW_MIGRATION_S=str(hold_s), COMPOSITION_TEST_OVERRIDES=json.dumps(composition))
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
@pytest.mark.version_smoke  # the matrix cell runs it too (Makefile): migrate's signals lift the timeouts
@pytest.mark.django_db
def test_migrate_holds_a_statement_longer_than_the_timeout_while_other_commands_cannot(
        scratch_database_url: str) -> None:
    sleep_longer = "from django.db import connection; connection.cursor().execute('SELECT pg_sleep(2)')"
    refused = _manage(scratch_database_url, "shell", "-c", sleep_longer, hold_s=0, DB_STATEMENT_TIMEOUT_S=1.0)
    assert refused.returncode != 0 and "statement timeout" in refused.stderr

    migrated = _manage(scratch_database_url, "migrate", "slowmigration", hold_s=2, DB_STATEMENT_TIMEOUT_S=1.0)
    assert migrated.returncode == 0, migrated.stderr
    assert "Applying slowmigration.0001_slow... OK" in migrated.stdout


@pytest.mark.slow
@pytest.mark.soak  # the gate's short version is the test above: a 2 s statement over a 1 s timeout
@pytest.mark.django_db
def test_migrate_runs_a_35_second_operation_under_the_default_timeouts(scratch_database_url: str) -> None:
    migrated = _manage(scratch_database_url, "migrate", "slowmigration", hold_s=35)
    assert migrated.returncode == 0, migrated.stderr
    assert "Applying slowmigration.0001_slow... OK" in migrated.stdout


@pytest.mark.django_db(transaction=True)
def test_a_block_can_opt_out_and_the_timeouts_come_back_after_it() -> None:
    connection.close()
    with override_settings(COMPOSITION={"DB_STATEMENT_TIMEOUT_S": 0.2}):
        with without_session_timeouts(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(0.5)")
        with pytest.raises(OperationalError, match="statement timeout"), transaction.atomic(), \
                connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(0.5)")
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_a_lift_reaches_only_the_calling_thread_s_connections() -> None:
    import threading

    from django.db import connections

    def timeout_seen_by_a_thread_opened_inside(alias: str) -> str:
        seen: list[str] = []

        def read() -> None:
            try:
                with connections[alias].cursor() as cursor:
                    cursor.execute("SHOW statement_timeout")
                    seen.append(cursor.fetchone()[0])
            finally:
                connections[alias].close()

        thread = threading.Thread(target=read)
        thread.start()
        thread.join()
        return seen[0]

    def own_timeout() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW statement_timeout")
            return str(cursor.fetchone()[0])

    connection.close()
    with override_settings(COMPOSITION={"DB_STATEMENT_TIMEOUT_S": 7.0}):
        with without_session_timeouts():
            assert own_timeout() == "0"
            # A worker thread that opens its connection meanwhile keeps its timeout: nothing
            # would restore it when the block ends.
            assert timeout_seen_by_a_thread_opened_inside("default") == "7s"
            connection.close()  # a connection the block's own thread opens again is lifted too
            assert own_timeout() == "0"
        assert own_timeout() == "7s"
    connection.close()
