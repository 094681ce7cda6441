"""Behind PgBouncer in transaction mode (``TRANSACTION_POOLED_DATABASES``), each test with a
PgBouncer of its own: the library leaves no session setting and no lock to the pooler's next
client, and ``manage.py check`` says what such a database needs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from composition.db.pooling import check_pooled_settings, check_pooled_timeouts
from composition.testing import ThrowawayPgBouncer, current_database_url, subprocess_env
from tests.helpers import pgbouncer_in_front, require_pgbouncer, session_seen

pytestmark = pytest.mark.slow

# What a process does through the pooler: connect (the timeouts), the readiness probe, a
# retention round, both kinds of database lock, a publish that relaxes its commit, and the lift
# of the timeouts, which it must refuse.
LIBRARY_AT_WORK = """
from django.db import connection, transaction
from composition.db import without_session_timeouts
from composition.errors import ConfigurationError
from composition.health.probes import probe_database
from composition.locks import advisory_lock, row_lock
from composition.outbox import publish
from composition.retention import prune_expired
from composition.testing import left_to_the_relay
from composition.jobs.models import DeadLetter
connection.ensure_connection()
probe_database(2.0)
prune_expired()
with transaction.atomic(), advisory_lock("pgbouncer-test", "k", timeout_s=1):
    pass
with transaction.atomic(), row_lock(DeadLetter.objects.all()[:1], timeout_s=1):
    pass
with left_to_the_relay():
    publish("noop", {})
try:
    with without_session_timeouts():
        pass
except ConfigurationError:
    print("lift refused")
"""


@pytest.fixture
def bouncer() -> Iterator[ThrowawayPgBouncer]:
    require_pgbouncer()
    # One server connection: whatever a client leaves on it, the next client gets.
    with pgbouncer_in_front(pool_size=1) as server:
        yield server


def _library_at_work(bouncer: ThrowawayPgBouncer, settings_module: str) -> str:
    database = connection.settings_dict["NAME"]
    result = subprocess.run([sys.executable, "manage.py", "shell", "-c", LIBRARY_AT_WORK],
                            env=subprocess_env(DATABASE_URL=bouncer.url(database),
                                               DJANGO_SETTINGS_MODULE=settings_module),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr + bouncer.log()[-2000:]
    return result.stdout


@pytest.mark.django_db(transaction=True)
def test_a_client_of_the_pooler_sees_the_server_defaults_after_the_library_ran_through_it(
        bouncer: ThrowawayPgBouncer) -> None:
    defaults = session_seen(current_database_url())  # a fresh direct session
    assert "lift refused" in _library_at_work(bouncer, "tests.settings_pgbouncer")
    database = connection.settings_dict["NAME"]
    assert session_seen(bouncer.url(database)) == defaults


@pytest.mark.django_db(transaction=True)
def test_without_the_setting_the_library_s_session_timeouts_reach_the_next_client(
        bouncer: ThrowawayPgBouncer) -> None:
    # What the setting is for (and what every process did before it): the session timeouts set
    # on connect stay on the pooled server connection.
    defaults = session_seen(current_database_url())
    _library_at_work(bouncer, "tests.settings")
    leaked = session_seen(bouncer.url(connection.settings_dict["NAME"]))
    assert leaked["statement_timeout"] != defaults["statement_timeout"], (leaked, defaults)


def test_check_requires_what_a_transaction_pooled_database_needs() -> None:
    env = subprocess_env(COMPOSITION_TEST_OVERRIDES=json.dumps({"TRANSACTION_POOLED_DATABASES": ["default"]}))
    result = subprocess.run([sys.executable, "manage.py", "check"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1 and "composition.E151" in result.stderr, result.stdout + result.stderr
    assert "DISABLE_SERVER_SIDE_CURSORS" in result.stderr

    pooled = {**settings.COMPOSITION, "TRANSACTION_POOLED_DATABASES": ["default"]}
    default = settings.DATABASES["default"]
    with override_settings(COMPOSITION=pooled):
        for entry, expected in (
                ({**default, "DISABLE_SERVER_SIDE_CURSORS": True}, []),
                ({**default, "DISABLE_SERVER_SIDE_CURSORS": True, "OPTIONS": {"options": "-c x=1"}},
                 ["composition.E152"]),
                ({**default, "DISABLE_SERVER_SIDE_CURSORS": True, "OPTIONS": {"server_side_binding": True}},
                 ["composition.E153"]),
                ({**default, "DISABLE_SERVER_SIDE_CURSORS": True, "OPTIONS": {"assume_role": "billing"}},
                 ["composition.E155"])):
            with override_settings(DATABASES={**settings.DATABASES, "default": entry}):
                assert [message.id for message in check_pooled_settings()] == expected
    with override_settings(COMPOSITION={**settings.COMPOSITION, "TRANSACTION_POOLED_DATABASES": ["nope"]}):
        assert [message.id for message in check_pooled_settings()] == ["composition.E150"]


@pytest.mark.django_db(transaction=True)
def test_the_database_check_reads_the_timeouts_the_role_or_database_gives_through_the_pooler() -> None:
    pooled = {**settings.COMPOSITION, "TRANSACTION_POOLED_DATABASES": ["default"]}
    database = connection.ops.quote_name(connection.settings_dict["NAME"])
    with override_settings(COMPOSITION=pooled):
        connection.close()  # a session without the library's own settings
        [warning] = check_pooled_timeouts(databases=["default"])
        assert warning.id == "composition.W154" and "ALTER ROLE" in warning.hint
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER DATABASE {database} SET statement_timeout = '30s'")
            cursor.execute(f"ALTER DATABASE {database} SET idle_in_transaction_session_timeout = '1min'")
        try:
            connection.close()
            assert check_pooled_timeouts(databases=["default"]) == []
        finally:
            with connection.cursor() as cursor:
                cursor.execute(f"ALTER DATABASE {database} RESET statement_timeout")
                cursor.execute(f"ALTER DATABASE {database} RESET idle_in_transaction_session_timeout")
            connection.close()


def _system(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", "system", *args],
                          env=subprocess_env(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="tests.settings_pgbouncer"),
                          capture_output=True, text=True, timeout=60)


@pytest.mark.django_db
def test_system_holds_the_server_connections_needed_at_once_against_the_pooler_s_pool() -> None:
    require_pgbouncer()
    database = connection.settings_dict["NAME"]
    # 2 worker processes x (4 threads + 1 for their background threads) + the scheduler's 1 +
    # 3 web processes x 2 threads = 17 held at once, whatever the pool.
    deployment = ["--worker-processes", "2", "--worker-threads", "4", "--web-processes", "3", "--web-threads", "2"]
    for pool_size, short in ((16, True), (17, False)):
        with pgbouncer_in_front(pool_size=pool_size, reserve_pool_size=2) as bouncer:
            result = _system(bouncer.url(database), "--json", *deployment)
            printed = _system(bouncer.url(database), *deployment)
        assert result.returncode == 0, result.stdout + result.stderr
        budget = json.loads(result.stdout)["connection_budget"]
        assert budget["pooled"] == {"held_at_once": 17, "pool_size": pool_size, "reserve_pool": 2,
                                    "max_client_conn": 500, "pool_short": short, "clients_over": False}
        assert budget["over_budget"] is short
        assert "server connections held at once: workers 2 x 5 + scheduler 1 x 1 + web 3 x 2 = 17, against a " \
               f"pool of {pool_size} (+2 reserve)" in printed.stdout, printed.stdout
        assert ("the deployment can hold 17 at once" in printed.stderr) is short, printed.stderr

    # A console it may not read (a managed pooler's): the budget is unchecked, not passed, until
    # --pool-size gives the size.
    with pgbouncer_in_front(pool_size=4, admin_users="nobody") as bouncer:
        refused = _system(bouncer.url(database), "--json", *deployment)
        given = _system(bouncer.url(database), "--json", *deployment, "--pool-size", "20")
    assert refused.returncode == 1 and "--pool-size" in refused.stderr, refused.stdout + refused.stderr
    assert given.returncode == 0, given.stdout + given.stderr
    assert json.loads(given.stdout)["connection_budget"]["pooled"]["pool_size"] == 20


@pytest.mark.django_db(transaction=True)
def test_dbtimeouts_gives_the_role_the_timeouts_its_new_sessions_start_with() -> None:
    # A role of its own: the machine's postgres role is every test's.
    import psycopg

    from composition.db.pooling import timeout_settings
    from tests.helpers import unique

    role = f"dbtimeouts_{unique()}".lower().replace("-", "_")
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        url = f"postgresql://{role}" + current_database_url()[current_database_url().index("@"):]
        env = subprocess_env(DATABASE_URL=url)
        printed = subprocess.run([sys.executable, "manage.py", "dbtimeouts"], env=env, capture_output=True,
                                 text=True, timeout=60)
        assert printed.returncode == 0, printed.stderr
        assert printed.stdout.splitlines() == [f"ALTER ROLE \"{role}\" SET {name} = '{value}';"
                                               for name, value in timeout_settings().items()]
        with psycopg.connect(url, autocommit=True) as before:
            assert before.execute("SHOW statement_timeout").fetchone() == ("0",)
        applied = subprocess.run([sys.executable, "manage.py", "dbtimeouts", "--apply"], env=env,
                                 capture_output=True, text=True, timeout=60)
        assert applied.returncode == 0, applied.stderr
        with psycopg.connect(url, autocommit=True) as after:
            seen = {name: after.execute(f"SHOW {name}").fetchone()[0] for name in timeout_settings()}
        assert seen == {"statement_timeout": "30s", "idle_in_transaction_session_timeout": "1min"}
        refused = subprocess.run([sys.executable, "manage.py", "dbtimeouts", "--database", "nope"], env=env,
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1 and "no DATABASES alias 'nope'" in refused.stderr
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP ROLE "{role}"')
