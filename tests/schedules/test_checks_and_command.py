"""``manage.py check`` refuses a bad schedule, naming it; ``manage.py schedules`` lists, pauses,
resumes and runs one."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError

from composition.outbox import OutboxMessage
from composition.pauses import Pause
from composition.schedules import TZDATA_VERSION, schedule
from composition.schedules.declaration import forget
from composition.schedules.models import ScheduleTick
from tests.helpers import unique
from tests.jobsapp import jobs


@pytest.fixture
def declared_names() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        forget(name)


def _errors_naming(name: str) -> list[str]:
    return [message.msg for message in run_checks() if name in message.msg and message.id.startswith("composition.E12")]


@pytest.mark.parametrize(("options", "says"), [
    ({"cron": "61 2 * * *"}, "bad cron expression '61 2 * * *'"),
    ({"cron": "30 2 * *"}, "five-field cron expression"),
    ({"cron": "30 2 * * *", "tz": "Europe/Atlantis"}, "unknown time zone tz='Europe/Atlantis'"),
    ({"every": timedelta(seconds=30), "payload": {"label": "x", "extra": 1}}, "the payload does not fit"),
    ({"every": timedelta(seconds=30), "payload": {}}, "the payload does not fit"),
    ({"every": timedelta(milliseconds=1500)}, "whole number of seconds"),
    ({"cron": "* * * * *", "every": timedelta(seconds=1)}, "exactly one of cron= and every="),
    ({"every": timedelta(seconds=5), "catch_up": "all"}, "needs catch_up_window="),
    ({"every": timedelta(seconds=5), "overlap": "queue"}, "overlap= must be one of"),
    # Silently ignored before: the schedule would not do what its author wrote.
    ({"cron": "0 3 * * *", "start": datetime(2027, 1, 1, tzinfo=UTC)}, "start= applies to every= only"),
    ({"every": timedelta(seconds=5), "catch_up_window": timedelta(hours=1)},
     "catch_up_window= applies to catch_up='all' only"),
    ({"every": timedelta(seconds=5), "payload": "x"}, "the payload does not fit"),
    ({"every": timedelta(seconds=5), "payload": 5}, "the payload does not fit"),
    # Every tick would be late by a round's few milliseconds: "skip" would fire none.
    ({"every": timedelta(seconds=5), "grace": timedelta(0)}, "grace= must be a timedelta of at least 1s"),
])
def test_check_refuses_a_bad_schedule_naming_it(declared_names: list[str], options: dict, says: str) -> None:
    name = unique("bad")
    declared_names.append(name)
    options.setdefault("payload", {"label": name})
    schedule(jobs.scheduled_effect, name=name, **options)
    errors = _errors_naming(name)
    assert len(errors) == 1 and says in errors[0], errors


def test_check_refuses_one_name_declared_twice_differently(declared_names: list[str]) -> None:
    name = unique("twice")
    declared_names.append(name)
    schedule(jobs.scheduled_effect, name=name, every=timedelta(seconds=5), payload={"label": "a"})
    schedule(jobs.scheduled_effect, name=name, every=timedelta(seconds=6), payload={"label": "a"})
    assert any("declared twice" in error for error in _errors_naming(name))


def test_a_good_schedule_passes_the_check(declared_names: list[str]) -> None:
    name = unique("good")
    declared_names.append(name)
    schedule(jobs.scheduled_effect, name=name, cron="30 2 * * *", tz="Europe/Berlin", payload={"label": name})
    assert _errors_naming(name) == []


def _command(*args: str) -> str:
    out = io.StringIO()
    call_command("schedules", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_the_command_lists_pauses_resumes_and_runs_a_schedule(declared_names: list[str]) -> None:
    name = unique("cmd")
    declared_names.append(name)
    schedule(jobs.scheduled_effect, name=name, cron="30 2 * * *", tz="Europe/Berlin", payload={"label": name})
    listed = json.loads(_command("list", "--json"))
    assert listed["tzdata"] == TZDATA_VERSION
    (row,) = [row for row in listed["schedules"] if row["name"] == name]
    assert (row["expression"], row["tz"], row["paused"], row["problems"]) == (
        "cron 30 2 * * *", "Europe/Berlin", None, [])
    assert row["next_fire_at"].endswith(("00:30:00+00:00", "01:30:00+00:00"))  # 02:30 Berlin, CEST or CET

    assert "was not paused" in _command("resume", name)  # never paused: no row, nothing recorded
    assert not Pause.objects.filter(name=name).exists()
    assert "paused" in _command("pause", name, "--reason", "month-end freeze", "--by", "alice")
    assert "was paused already" in _command("pause", name, "--by", "alice")
    pause_row = Pause.objects.get(kind=Pause.SCHEDULE, name=name)
    assert (pause_row.paused, pause_row.changed_by, pause_row.reason) == (True, "alice", "month-end freeze")
    text = _command("list")
    assert f"tzdata {TZDATA_VERSION}" in text and "paused by alice" in text and "month-end freeze" in text
    assert "resumed" in _command("resume", name, "--by", "bob")
    assert Pause.objects.get(kind=Pause.SCHEDULE, name=name).paused is False

    assert _command("run", name).strip().endswith("its regular ticks are unchanged")
    tick = ScheduleTick.objects.get(schedule=name)
    assert tick.manual and OutboxMessage.objects.filter(headers__schedule__tick=tick.pk).count() == 1

    with pytest.raises(CommandError, match="no schedule named 'nope'"):
        _command("pause", "nope")
    with pytest.raises(CommandError, match="needs a schedule's name"):
        _command("run")
    with pytest.raises(CommandError, match="--by and --reason are for pause and resume, not run"):
        _command("run", name, "--by", "alice")  # who ran it would not be recorded
    with pytest.raises(CommandError, match="--json is for list, not run"):
        _command("run", name, "--json")
    assert ScheduleTick.objects.filter(schedule=name).count() == 1  # neither ran
    _command("pause", name)
    assert "(paused: they stay paused)" in _command("run", name)


# A process that declares a schedule the checks refuse, then runs `manage.py schedules list`.
LIST_WITH_A_BROKEN_SCHEDULE = """
import sys
from datetime import timedelta
import django
django.setup()
from django.core.management import execute_from_command_line
from composition.schedules import schedule
from tests.jobsapp import jobs
schedule(jobs.scheduled_effect, name=sys.argv[1], every=timedelta(seconds=30), payload={"label": 5})
execute_from_command_line(["manage.py", "schedules", "list"])
"""


def test_the_list_shows_a_schedule_s_problem_where_the_checks_would_stop_every_other_command() -> None:
    import subprocess
    import sys

    from composition.testing import subprocess_env

    name = unique("broken")
    done = subprocess.run([sys.executable, "-c", LIST_WITH_A_BROKEN_SCHEDULE, name], capture_output=True, text=True,
                          timeout=60, env=subprocess_env())
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith(name)]
    assert "problem: the payload does not fit" in line, line
