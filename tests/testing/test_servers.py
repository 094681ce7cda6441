"""``composition.testing.ThrowawayPostgres``: a private server that outage tests stop, crash and
start again on the same data, never the machine's shared one."""

from __future__ import annotations

import psycopg
import pytest

from composition.testing import throwaway_postgres
from tests.helpers import ROOT


@pytest.mark.slow
def test_a_private_postgres_restarts_on_its_data_and_takes_migrations() -> None:
    with throwaway_postgres("outage") as server:
        assert server.port != 5432
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (n int)")
            conn.execute("INSERT INTO kept VALUES (1)")

        server.stop()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(server.url, connect_timeout=1)
        server.start()
        server.kill()  # a crash: the next start recovers from the WAL
        server.start()
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT n FROM kept").fetchall() == [(1,)]

        server.migrate("tests.settings", cwd=str(ROOT))
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT to_regclass('composition_outboxmessage')").fetchone() == (
                "composition_outboxmessage",)
        data_dir = server.pgdata
    assert not data_dir.exists()
