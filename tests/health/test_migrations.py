"""Readiness fails, naming them, while composition's migrations are not applied."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import connections
from django.test import Client, override_settings

from composition.conf import conf
from composition.health import checks as health
from composition.health.migrations import probe_migrations
from composition.testing import subprocess_env
from tests.helpers import ROOT

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_readiness() -> Iterator[None]:
    health.reset_readiness_cache()
    yield
    health.reset_readiness_cache()


def test_readiness_fails_naming_the_migrations_an_upgrade_left_unapplied(database_before_an_upgrade: str) -> None:
    # It said ok, while runworkers' scheduler failed on a column of 0017 every round.
    env = subprocess_env(DATABASE_URL=database_before_an_upgrade, DJANGO_SETTINGS_MODULE="tests.settings")
    result = subprocess.run([sys.executable, "manage.py", "health", "readiness", "--json"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=30)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    body = json.loads(result.stdout[result.stdout.index("{"):])
    assert body["status"] == "fail" and body["failing"] == ["migrations"], body
    check = body["checks"]["migrations"]
    assert check["critical"] is True
    assert "composition's migrations are not applied: 0017_schedule_timing_pause_start, " in check["error"], check
    assert check["error"].endswith("; run python manage.py migrate"), check


def test_readyz_checks_the_migrations_at_the_database_s_level(client: Client) -> None:
    body = client.get("/readyz").json()
    assert body["status"] == "ok" and body["checks"]["migrations"]["ok"] is True, body
    levels = {**conf.HEALTH_DEPENDENCIES, "database": "ignore"}
    health.reset_readiness_cache()
    with override_settings(COMPOSITION={**settings.COMPOSITION, "HEALTH_DEPENDENCIES": levels}):
        body = client.get("/readyz").json()
    assert "migrations" not in body["checks"] and "database" not in body["checks"], body


def test_the_probe_leaves_no_connection_open_in_its_thread() -> None:
    opened: list[bool] = []

    def probe() -> None:
        probe_migrations(2.0)
        opened.append(connections["default"].connection is not None)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join(10)
    assert opened == [False]
