"""The gate itself: what `make test` runs without any service URL set."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.db import connection

from composition.outbox import OutboxMessage
from composition.testing import subprocess_env
from tests.backend.base import TRUNCATE_OVER_ROWS
from tests.helpers import ROOT, unique


@pytest.mark.rabbitmq
def test_rabbitmq_tests_run_without_rabbitmq_url_when_rabbitmq_listens() -> None:
    env = {key: value for key, value in subprocess_env().items() if key not in ("RABBITMQ_URL", "CI")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
         "tests/broker/test_rabbitmq.py::test_readiness_probes_rabbitmq_up_and_down"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert "1 passed" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    assert "skipped" not in result.stdout


def _matrix_tests() -> list[str]:
    """The Makefile's ``MATRIX_TESTS``: the paths the matrix cell runs."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith("MATRIX_TESTS :=")]
    return line.split(":=", 1)[1].split()


def test_the_matrix_cell_lists_paths_that_exist_and_every_file_with_a_version_smoke_test() -> None:
    listed = _matrix_tests()
    assert listed and [path for path in listed if not (ROOT / path).exists()] == []

    def on_the_list(path: str) -> bool:
        return any(path == entry or path.startswith(entry.rstrip("/") + "/") for entry in listed)

    # A version_smoke test in a file the matrix cell never opens would promise a run that never happens.
    smoke = re.compile(r"^(@pytest\.mark\.version_smoke\b|pytestmark = .*\bpytest\.mark\.version_smoke\b)", re.M)
    marked = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
                    if smoke.search(path.read_text()))
    assert marked and [path for path in marked if not on_the_list(path)] == []


def _files(*tables: str) -> tuple[int, ...]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join("pg_relation_filenode(%s)" for _ in tables), list(tables))
        return tuple(cursor.fetchone())


@pytest.mark.django_db(transaction=True)
def test_the_flush_between_transactional_tests_empties_every_table_and_keeps_small_tables_files() -> None:
    # The flush Django runs after each transactional test (tests/backend/base.py): rows that
    # reference each other go (the foreign keys' checks are off for it, as for TRUNCATE), a small
    # table keeps its files, and one that held many rows is truncated.
    from django.contrib.admin.models import LogEntry
    from django.contrib.auth.models import Group, User

    if connection.settings_dict["ENGINE"] != "tests.backend":
        pytest.skip("DATABASE_ENGINE names another backend")
    user = User.objects.create(username=unique("flush"))
    group = Group.objects.create(name=unique("flush"))
    user.groups.add(group)
    LogEntry.objects.create(user=user, action_flag=1, object_repr="flushed")
    OutboxMessage.objects.bulk_create([OutboxMessage(actor_name="flush", queue_name="flush", payload={})
                                       for _ in range(TRUNCATE_OVER_ROWS + 1)])
    small = _files("auth_user", "auth_group", "django_admin_log")
    big = _files(OutboxMessage._meta.db_table)
    call_command("flush", verbosity=0, interactive=False, reset_sequences=False, inhibit_post_migrate=True)
    assert (User.objects.count(), Group.objects.count(), User.groups.through.objects.count(),
            LogEntry.objects.count(), OutboxMessage.objects.count()) == (0, 0, 0, 0, 0)
    assert _files("auth_user", "auth_group", "django_admin_log") == small
    assert _files(OutboxMessage._meta.db_table) != big
