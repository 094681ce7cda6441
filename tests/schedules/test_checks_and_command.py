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
from tests.helpers import staff_client, table_row, unique
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


# Celery beat's habits (seconds as numbers, no zone): each crashed check, schedules list, jobs
# check-compat or the operations page with a traceback instead of being named.
WRONGLY_TYPED = [
    ({"every": 30}, "every= must be a timedelta, got 30"),
    ({"cron": "0 3 * * *", "tz": None}, "unknown time zone tz=None"),
    ({"every": timedelta(seconds=5), "catch_up": "all", "catch_up_window": 60}, "needs catch_up_window="),
    ({"every": timedelta(seconds=5), "catch_up_max": True}, "catch_up_max= must be an integer"),
    ({"every": timedelta(seconds=5), "max_pending": True}, "max_pending= must be a positive integer"),
]


@pytest.mark.django_db(transaction=True)
def test_wrongly_typed_arguments_are_named_by_check_list_and_check_compat_never_raised(
        declared_names: list[str]) -> None:
    from composition.schedules.status import schedule_rows

    names = []
    for options, says in WRONGLY_TYPED:
        name = unique("typed")
        declared_names.append(name)
        names.append((name, says))
        schedule(jobs.scheduled_effect, name=name, payload={"label": name}, **options)
    for bad_name, says in ((5, "name= must be a string"), ("  ", "name= must be a string")):
        declared_names.append(bad_name)  # type: ignore[arg-type]
        names.append((bad_name, says))  # type: ignore[arg-type]
        schedule(jobs.scheduled_effect, name=bad_name, every=timedelta(seconds=5),  # type: ignore[arg-type]
                 payload={"label": "x"})
    errors = [message.msg for message in run_checks() if message.id == "composition.E121"]
    for name, says in names:
        assert [error for error in errors if error.startswith(f"schedule {name!r}: ") and says in error], (name, errors)
    rows = {row.name: row for row in schedule_rows()}
    listed = {row["name"]: row for row in json.loads(_command("list", "--json"))["schedules"]}
    for name, says in names:
        assert any(says in problem for problem in rows[str(name)].problems), rows[str(name)]
        assert any(says in problem for problem in listed[str(name)]["problems"])
    assert "problem: every= must be a timedelta" in _command("list")
    out = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("jobs", "check-compat", stdout=out)
    assert "every= must be a timedelta, got 30" in out.getvalue()


def test_a_schedule_named_after_a_renamed_job_is_a_warning_until_it_keeps_the_old_name(
        declared_names: list[str]) -> None:
    # Both names fired during a rolling deploy: the old hosts' schedule "old", the new hosts' "new".
    from composition.jobs import job

    old, new = unique("old_job"), unique("new_job")
    renamed = job(queue=jobs.SCHEDULE_QUEUE, actor_name=new, aliases=[old])(jobs.scheduled_effect.fn)

    def warnings() -> list[str]:
        return [message.msg for message in run_checks() if message.id == "composition.W123" and new in message.msg]

    schedule(renamed, every=timedelta(seconds=5), payload={"label": "x"})
    declared_names.append(new)
    [warning] = warnings()
    assert f"renamed from {old!r}" in warning and "every tick twice" in warning
    [hint] = [message.hint for message in run_checks() if message.id == "composition.W123" and new in message.msg]
    assert f"Give it name={old!r} to keep one schedule" in (hint or "")
    forget(new)
    schedule(renamed, name=old, every=timedelta(seconds=5), payload={"label": "x"})  # the fix: one schedule
    declared_names.append(old)
    assert warnings() == []
    schedule(renamed, name=new, every=timedelta(seconds=5), payload={"label": "x"})  # afresh, on purpose
    assert warnings() == []
    # Renamed twice: which old name the running code's schedule has is for the author to say.
    first, second, third = unique("first_job"), unique("second_job"), unique("third_job")
    twice = job(queue=jobs.SCHEDULE_QUEUE, actor_name=third, aliases=[first, second])(jobs.scheduled_effect.fn)
    schedule(twice, every=timedelta(seconds=5), payload={"label": "x"})
    declared_names.append(third)
    [hint] = [message.hint for message in run_checks() if message.id == "composition.W123" and third in message.msg]
    assert f"one of {first!r}, {second!r}" in (hint or "")


@pytest.mark.django_db(transaction=True)
def test_a_paused_schedule_taken_out_of_the_code_is_listed_and_its_pause_can_be_lifted(
        declared_names: list[str]) -> None:
    # It could not be resumed (no schedule of that name), and came back paused when declared again.
    from composition.schedules.status import NOT_DECLARED

    name = unique("removed")
    declared_names.append(name)
    schedule(jobs.scheduled_effect, name=name, every=timedelta(seconds=30), payload={"label": name})
    _command("pause", name, "--reason", "before removal")
    forget(name)
    (row,) = [row for row in json.loads(_command("list", "--json"))["schedules"] if row["name"] == name]
    assert row["problems"] == [NOT_DECLARED] and row["paused"]["reason"] == "before removal"
    assert f"problem: {NOT_DECLARED}; paused by" in _command("list") and "(before removal)" in _command("list")
    assert "resumed" in _command("resume", name)
    assert Pause.objects.get(kind=Pause.SCHEDULE, name=name).paused is False
    assert name not in [row["name"] for row in json.loads(_command("list", "--json"))["schedules"]]
    with pytest.raises(CommandError, match=f"no schedule named {name!r}"):
        _command("pause", name)  # a pause needs the schedule in the code
    with pytest.raises(CommandError, match=f"no schedule named {name!r}"):
        _command("resume", name)  # nothing paused under that name now


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


@pytest.mark.django_db(transaction=True)
def test_a_schedule_left_to_the_hosts_of_its_new_timing_is_listed_so_not_as_running_behind(
        declared_names: list[str]) -> None:
    # Listed "running", its lag growing: that it was handed to the new timing was only in a log.
    from django.conf import settings
    from django.test import override_settings

    from composition.schedules.firing import database_now
    from composition.schedules.models import ScheduleState

    name = unique("deploying")
    declared_names.append(name)
    old = schedule(jobs.scheduled_effect, name=name, every=timedelta(seconds=60), payload={"label": name})
    changed_at = database_now() - timedelta(minutes=3)
    ScheduleState.objects.create(name=name, watermark=changed_at, timing="every 30s start=-",
                                 previous_timing=old.timing, timing_changed_at=changed_at, updated_at=changed_at)
    with override_settings(COMPOSITION={**settings.COMPOSITION, "DEPLOY_WINDOW_S": 300}):
        (row,) = [row for row in json.loads(_command("list", "--json"))["schedules"] if row["name"] == name]
        assert (row["left_to_timing"], row["lag_s"], row["next_fire_at"]) == ("every 30s start=-", 0.0, None)
        assert datetime.fromisoformat(row["left_until"]) == changed_at + timedelta(seconds=300)
        assert "left to the hosts of its new timing (every 30s start=-) until" in _command("list")
        page = staff_client("view_operations").get("/admin/composition/operations/").content.decode()
        assert "left to the hosts of its new timing" in table_row(page, "data-schedule", name)
        # Paused as well: both are said, the pause first (it hid behind the hand-over).
        _command("pause", name, "--reason", "month-end")
        (line,) = [line for line in _command("list").splitlines() if line.startswith(name)]
        assert "paused by" in line and "(month-end); left to the hosts of its new timing" in line
        page = staff_client("view_operations").get("/admin/composition/operations/").content.decode()
        row = table_row(page, "data-schedule", name)
        assert "month-end" in row and "left to the hosts of its new timing" in row and "running" not in row
        _command("resume", name)
    # Past the window (a rollback) this timing takes it back: it is listed as its own again.
    (row,) = [row for row in json.loads(_command("list", "--json"))["schedules"] if row["name"] == name]
    assert row["left_until"] is None and row["next_fire_at"] is not None
