"""``pause_queue`` / ``resume_queue`` and ``manage.py queues``: what they accept, what they refuse
and say, and what ``list`` shows (depth, oldest waiting work, who paused it, when and why)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.db import transaction

from composition.outbox import publish
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.pauses import Pause
from composition.queues import QueueNotPausable, known_queues, pause_queue, paused_queue_names, resume_queue
from composition.testing import left_to_the_relay, subprocess_env
from tests.helpers import ROOT
from tests.jobsapp import jobs

pytestmark = [pytest.mark.django_db, pytest.mark.empty_queues(jobs.PAUSE_QUEUE)]

QUEUE = jobs.PAUSE_QUEUE


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("queues", *args, stdout=out)
    return out.getvalue()


def test_a_second_pause_says_its_reason_was_not_recorded() -> None:
    assert "paused: within 0.5 s" in _run("pause", QUEUE, "--reason", "provider outage", "--by", "alice")
    assert _run("pause", QUEUE, "--reason", "provider outage").strip() == f"queue {QUEUE} was paused already"
    again = _run("pause", QUEUE, "--reason", "deploy")
    assert "was paused already (by alice: provider outage); the new reason is not recorded" in again
    assert Pause.objects.get(kind=Pause.QUEUE, name=QUEUE).reason == "provider outage"


def test_a_reason_over_500_characters_is_refused_as_the_admin_refuses_it() -> None:
    with pytest.raises(CommandError, match="a reason is at most 500 characters, got 2000"):
        _run("pause", QUEUE, "--reason", "x" * 2000)
    assert not Pause.objects.filter(kind=Pause.QUEUE, name=QUEUE).exists()


def test_pause_and_resume_change_the_row_once_and_say_so() -> None:
    assert QUEUE in known_queues()
    row, changed = pause_queue(QUEUE, by="ops", reason="provider outage")
    assert changed and row.paused and row.reason == "provider outage"
    assert paused_queue_names() == {QUEUE}
    assert pause_queue(QUEUE, by="ops")[1] is False  # paused already: nothing recorded again
    assert resume_queue(QUEUE, by="ops")[1] is True
    assert resume_queue(QUEUE, by="ops")[1] is False
    assert paused_queue_names() == frozenset()


def test_a_name_that_is_no_queue_and_the_relay_s_queue_are_refused_with_the_reason() -> None:
    with pytest.raises(QueueNotPausable, match=r"no queue named 'jobs_nope' \(the queues: .*jobs_pause"):
        pause_queue("jobs_nope", by="ops")
    with pytest.raises(QueueNotPausable, match="outbox relay's queue"):
        pause_queue(RELAY_QUEUE_NAME, by="ops")
    with pytest.raises(CommandError, match="no queue named 'jobs_nope'"):
        _run("pause", "jobs_nope")
    with pytest.raises(CommandError, match="pause needs a queue's name"):
        _run("pause")
    with pytest.raises(CommandError, match="list takes no name"):
        _run("list", QUEUE)
    for args, says in ((("limits", QUEUE), "limits takes no name"),
                       (("list", "--by", "ops"), "--by and --reason are for pause, resume and purge, not list"),
                       (("limits", "--reason", "x"), "--by and --reason are for pause, resume and purge, not limits"),
                       (("pause", QUEUE, "--json"), "--json is for list, purge and limits, not pause")):
        with pytest.raises(CommandError, match=says):
            _run(*args)
    with pytest.raises(CommandError, match="at most 150 characters, got 200"):
        _run("pause", QUEUE, "--by", "x" * 200)
    # A newline split its row of `queues list` in two.
    for broken in ("line one\nline two", "tab\there", "separator\u2028here"):
        with pytest.raises(CommandError, match="a reason is one line of text"):
            _run("pause", QUEUE, "--reason", broken)
    with pytest.raises(ValueError, match="at most 150 characters"):
        pause_queue(QUEUE, by="x" * 151)
    assert not Pause.objects.exists()


def test_a_queue_paused_before_its_jobs_were_removed_can_still_be_resumed() -> None:
    Pause.objects.create(kind=Pause.QUEUE, name="jobs_removed_by_a_deploy", changed_by="ops",
                         changed_at="2026-01-01T00:00:00Z")
    assert "resumed" in _run("resume", "jobs_removed_by_a_deploy")


def test_list_shows_depth_oldest_wait_and_who_paused_it_when_and_why() -> None:
    with left_to_the_relay(), transaction.atomic():
        for index in range(3):
            publish("pause_effect", {"key": f"list-{index}", "hold_s": 0.0})
    User.objects.create_user("viewer", password="x")
    # A user who may not pause on the operations page may not be named as having paused here.
    with pytest.raises(CommandError, match=r"--by viewer: composition\.change_pauses is required"):
        _run("pause", QUEUE, "--by", "viewer")
    assert not Pause.objects.exists()
    User.objects.create_user("alice", password="x").user_permissions.add(
        Permission.objects.get(codename="change_pauses"))
    # Text, not control: a no-break space (pasted from a chat) and an emoji's joiner.
    assert Pause.objects.filter(kind=Pause.QUEUE).count() == 0
    assert "paused" in _run("pause", QUEUE, "--reason", "deploy\u00a0in progress \U0001f468\u200d\U0001f469")
    _run("resume", QUEUE)
    assert "paused: within 0.5 s no worker starts a job of it" in _run("pause", QUEUE, "--by", "alice",
                                                                       "--reason", "deploy")
    pause_row = Pause.objects.get(kind=Pause.QUEUE, name=QUEUE)
    assert [entry.change_message for entry in LogEntry.objects.filter(object_id=str(pause_row.pk))] == [
        "Paused: deploy"]

    table = _run("list")
    line = next(line for line in table.splitlines() if line.startswith(QUEUE + " "))
    assert line.split()[1] == "3" and "paused by alice since" in line and "(deploy)" in line
    listed = {row["name"]: row for row in json.loads(_run("list", "--json"))["queues"]}
    assert listed[QUEUE]["depth"] == 3 and listed[QUEUE]["oldest_age_s"] >= 0
    assert listed[QUEUE]["paused"]["by"] == "alice" and listed[QUEUE]["paused"]["reason"] == "deploy"
    assert listed[jobs.NOOP_QUEUE]["paused"] is None
    # Nothing waits in it: no age (it read 0.0 s, as if something had just arrived).
    assert (listed[jobs.NOOP_QUEUE]["depth"], listed[jobs.NOOP_QUEUE]["oldest_age_s"]) == (0, None)
    assert "was paused already" in _run("pause", QUEUE)
    assert "resumed: its waiting jobs run" in _run("resume", QUEUE)


def test_list_with_the_broker_down_prints_the_pauses_and_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    from composition.broker.configured import build_broker
    from composition.queues import status
    from composition.testing import free_port

    # A real Redis client on a port nobody listens on: what `queues list` meets at 3 a.m.
    down = build_broker(f"redis://127.0.0.1:{free_port()}/0", heartbeat_timeout_s=4, maintenance_chance=0,
                        socket_timeout_s=0.3, connect_timeout_s=0.3, middleware=[])
    down.declare_queue(QUEUE)
    monkeypatch.setattr(status, "configured_broker", lambda: down)
    pause_queue(QUEUE, by="ops", reason="provider outage")
    out = io.StringIO()
    with pytest.raises(CommandError, match=f"the broker could not be read: the depth of .*{QUEUE}.* is unknown"):
        call_command("queues", "list", stdout=out)
    line = next(line for line in out.getvalue().splitlines() if line.startswith(QUEUE + " "))
    assert "? (broker: " in line and "provider outage" in line
    out = io.StringIO()
    with pytest.raises(CommandError, match="the broker could not be read"):
        call_command("queues", "list", "--json", stdout=out)
    row = next(row for row in json.loads(out.getvalue())["queues"] if row["name"] == QUEUE)
    assert row["depth"] is None and row["broker_error"]


@pytest.mark.django_db(transaction=True)
def test_a_project_without_the_admin_pauses_and_resumes(tmp_path: Path) -> None:
    """An API-only monolith: every manage.py command crashed on the admin's LogEntry, imported
    when composition's apps loaded."""
    (tmp_path / "settings_without_admin.py").write_text(
        "from tests.settings import *  # noqa: F403\n"
        "INSTALLED_APPS = [app for app in INSTALLED_APPS if app != 'django.contrib.admin']  # noqa: F405\n"
        "ROOT_URLCONF = 'composition.urls'\n")
    User.objects.create_user("alice", password="x").user_permissions.add(
        Permission.objects.get(codename="change_pauses"))
    env = subprocess_env(DJANGO_SETTINGS_MODULE="settings_without_admin", PYTHONPATH=f"{ROOT}:{tmp_path}")
    for args in (["check"], ["queues", "pause", QUEUE, "--by", "alice"], ["queues", "resume", QUEUE]):
        ran = subprocess.run([sys.executable, "-m", "django", *args], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=120)
        assert ran.returncode == 0, (args, ran.stderr[-2000:])
    row = Pause.objects.get(kind=Pause.QUEUE, name=QUEUE)
    assert (row.paused, row.changed_by) == (False, row.changed_by) and not LogEntry.objects.exists()
