"""Embedded PostgreSQL and Valkey from wheels: start, migrate, ready."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT


@pytest.mark.slow
def test_embedded_servers_start_migrate_and_report_ready(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "REDIS_URL", "BROKER_URL")}
    env.update(COMPOSITION_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="project.settings")
    # One process: the settings start both servers, migrate runs, readiness probes them; the
    # servers stop when the process exits.
    script = (
        "import django, os; from django.core.management import call_command;"
        "django.setup();"
        "call_command('migrate', verbosity=0);"
        "from composition import health; report = health.readiness(use_cache=False);"
        "print(os.environ['DATABASE_URL'], os.environ['REDIS_URL']);"
        "print('READY' if report.ok else report.as_dict())"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "READY" in result.stdout, result.stdout + result.stderr
    assert "using embedded services" in result.stderr
    assert str(tmp_path) in result.stdout  # the database socket lives under the data dir
    assert (tmp_path / "postgres" / "PG_VERSION").exists()
    assert not (tmp_path / "valkey" / "server.json").exists()  # the owner stopped its server


DEATH_AND_A_STALE_PID = """
import json, os, signal, sys, time
from pathlib import Path
from project.embedded import EmbeddedPostgres, EmbeddedValkey

data = Path(sys.argv[1])
postgres, valkey = EmbeddedPostgres(data), EmbeddedValkey(data)
postgres.start(); valkey.start()
print("alive", postgres.alive(), valkey.alive())
os.kill(json.loads(valkey.state_file.read_text())["pid"], signal.SIGKILL)
deadline = time.monotonic() + 10
while valkey.alive() and time.monotonic() < deadline:
    time.sleep(0.05)
print("valkey killed, alive", postgres.alive(), valkey.alive())
valkey.stop(5)
# A crash's postmaster.pid whose pid another process has taken since (this one's parent's).
pid_file = postgres.pgdata / "postmaster.pid"
left = pid_file.read_text().split("\\n")
postgres.stop(5)
pid_file.write_text("\\n".join([str(os.getppid()), *left[1:]]))
print("stale pid, alive", postgres.alive())
"""

START_AGAIN = """
import sys
from pathlib import Path
import psycopg
from project.embedded import EmbeddedPostgres

postgres = EmbeddedPostgres(Path(sys.argv[1]))
postgres.start()
with psycopg.connect(postgres.url) as connection:
    print("started again", connection.execute("SELECT 1").fetchone()[0], postgres.alive())
postgres.stop(5)
"""


@pytest.mark.slow
def test_a_dead_server_is_told_and_a_stale_pid_file_does_not_stop_the_next_start(tmp_path: Path) -> None:
    # ./run's System asks alive(): a server killed under it went unnoticed (its Ctrl-C exited 0),
    # and a crash's postmaster.pid naming a pid another process had taken made every start fail.
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "REDIS_URL")}
    lines = []
    for script in (DEATH_AND_A_STALE_PID, START_AGAIN):
        result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        lines += result.stdout.splitlines()
    assert lines == ["alive True True", "valkey killed, alive True False", "stale pid, alive False",
                     "started again 1 True"]
