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
