"""``runworkers`` on a database whose composition migrations are not applied: refused before any
component starts, with the migrations to apply and the command that applies them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from composition.testing import subprocess_env
from tests.helpers import ROOT

pytestmark = pytest.mark.django_db


def _runworkers(database_url: str) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(DATABASE_URL=database_url, DJANGO_SETTINGS_MODULE="tests.settings")
    # Started, it would run until killed: the timeout fails the test rather than hang it.
    return subprocess.run([sys.executable, "manage.py", "runworkers", "--processes", "1", "--metrics-port", "off"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)


def test_runworkers_refuses_a_database_upgraded_without_migrate(database_before_an_upgrade: str) -> None:
    # It started, and the scheduler failed on composition_schedulestate.timing 40 times a second.
    result = _runworkers(database_before_an_upgrade)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "composition's migrations are not applied: 0017_schedule_timing_pause_start, " \
           "0018_schedule_previous_timing" in output, output[-3000:]
    assert "0016_" not in output and "run python manage.py migrate" in output, output[-3000:]
    assert "component started" not in output, output[-3000:]


def test_runworkers_refuses_a_fresh_database_naming_migrate(scratch_database_url: str) -> None:
    # It said: component 'queue-pauses': failed to start: ProgrammingError: relation
    # "composition_pause" does not exist.
    result = _runworkers(scratch_database_url)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "composition's migrations are not applied: 0001_initial, " in output, output[-3000:]
    assert "run python manage.py migrate" in output and "component started" not in output, output[-3000:]
