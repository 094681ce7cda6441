"""The schedules on the operations page: what each shows, and pause and resume for who may, each
change in the admin's history of its ``Pause`` row; the command line's by a named user too."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.core.management import call_command

from composition.pauses import Pause
from composition.schedules import schedule
from composition.schedules.declaration import forget
from tests.helpers import staff_client, table_row, unique
from tests.jobsapp import jobs

pytestmark = pytest.mark.django_db

PAGE = "/admin/composition/operations/"
POST = "/admin/composition/operations/schedule/"


@pytest.fixture
def nightly() -> Iterator[str]:
    name = unique("nightly")
    schedule(jobs.scheduled_effect, name=name, cron="30 2 * * *", tz="Europe/Berlin", payload={"label": name})
    yield name
    forget(name)


def test_an_operator_who_may_pauses_and_resumes_a_schedule_from_the_page(nightly: str) -> None:
    client = staff_client("view_operations", "change_pauses")
    row = table_row(client.get(PAGE).content.decode(), "data-schedule", nightly)
    assert "cron 30 2 * * *" in row and "Europe/Berlin" in row and "running" in row and 'value="Pause"' in row

    answer = client.post(POST, {"name": nightly, "action": "pause", "reason": "month-end freeze"}, follow=True)
    assert f"Schedule {nightly} paused." in answer.content.decode()
    row = table_row(answer.content.decode(), "data-schedule", nightly)
    assert "paused by" in row and "month-end freeze" in row and 'value="Resume"' in row
    pause_row = Pause.objects.get(kind=Pause.SCHEDULE, name=nightly)
    client.post(POST, {"name": nightly, "action": "resume"})
    assert not Pause.objects.get(pk=pause_row.pk).paused
    history = list(LogEntry.objects.filter(object_id=str(pause_row.pk)).order_by("pk")
                   .values_list("change_message", flat=True))
    assert history == ["Paused: month-end freeze", "Resumed"]


def test_without_the_permission_there_is_no_button_and_a_post_is_refused(nightly: str) -> None:
    client = staff_client("view_operations")
    assert 'value="Pause"' not in table_row(client.get(PAGE).content.decode(), "data-schedule", nightly)
    assert client.post(POST, {"name": nightly, "action": "pause"}).status_code == 403
    assert not Pause.objects.filter(name=nightly).exists()


def test_an_unknown_schedule_or_action_changes_nothing(nightly: str) -> None:
    client = staff_client("view_operations", "change_pauses")
    for data, says in (({"name": "nope", "action": "pause"}, "No schedule &#x27;nope&#x27; to pause"),
                       ({"name": nightly, "action": "explode"}, "No action &#x27;explode&#x27;")):
        answer = client.post(POST, data, follow=True)
        assert says in answer.content.decode()
    assert not Pause.objects.exists()
    assert client.get(POST).status_code == 405


def test_a_pause_from_the_command_line_by_a_named_user_is_in_the_history(nightly: str) -> None:
    User.objects.create_user("alice", password="x").user_permissions.add(
        Permission.objects.get(codename="change_pauses"))
    call_command("schedules", "pause", nightly, "--by", "alice", "--reason", "deploy", stdout=io.StringIO())
    call_command("schedules", "resume", nightly, stdout=io.StringIO())  # the login name: no such user
    pause_row = Pause.objects.get(name=nightly)
    entries = LogEntry.objects.filter(object_id=str(pause_row.pk))
    assert [(entry.user.username, entry.change_message) for entry in entries] == [("alice", "Paused: deploy")]
    assert pause_row.changed_by.endswith("(manage.py)")


def test_a_paused_schedule_no_code_declares_is_shown_and_its_pause_can_be_lifted_from_the_page(nightly: str) -> None:
    # "No schedule to resume": the pause stayed, and the schedule came back paused when declared again.
    client = staff_client("view_operations", "change_pauses")
    client.post(POST, {"name": nightly, "action": "pause", "reason": "before removal"})
    forget(nightly)
    row = table_row(client.get(PAGE).content.decode(), "data-schedule", nightly)
    assert "not declared" in row and "before removal" in row and 'value="Resume"' in row
    answer = client.post(POST, {"name": nightly, "action": "pause"}, follow=True)
    assert f"No schedule &#x27;{nightly}&#x27; to pause" in answer.content.decode()
    client.post(POST, {"name": nightly, "action": "resume"})
    assert not Pause.objects.get(kind=Pause.SCHEDULE, name=nightly).paused
    assert f'data-schedule="{nightly}"' not in client.get(PAGE).content.decode()
