"""Bulk replay and discard as an operator meets them at 3 a.m.: a row that cannot be replayed is
refused by name while the others go on, the command exits non-zero when it did not do all it was
asked, and what the confirmation counted is what is acted on (rows that fail meanwhile wait)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from dramatiq import Message
from dramatiq.broker import MessageProxy

from composition.admin import dead_letters as dead_letter_admin
from composition.errors import PermanentError
from composition.jobs.deadletters import record_dead_letter
from composition.jobs.models import DeadLetter
from composition.outbox import OutboxMessage
from composition.testing import free_port, subprocess_env
from tests.helpers import ROOT
from tests.jobs.test_deadletters import dead_letter
from tests.jobsapp import jobs

URL = "/admin/composition/deadletter/"


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("deadletters", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def _of_a_removed_actor() -> DeadLetter:
    """A dead letter with positional args whose actor a deploy has since removed: its arguments
    cannot be named from a signature any more."""
    message = MessageProxy(Message(queue_name=jobs.CHECK_QUEUE, actor_name="charge_v1_removed", args=("acme", 5),
                                   kwargs={}, options={}))
    return DeadLetter.objects.get(pk=record_dead_letter(message, PermanentError("no account"), attempts=1))


@pytest.mark.django_db
def test_a_bulk_replay_refuses_a_row_of_a_removed_actor_and_replays_the_others() -> None:
    first = dead_letter(key="a", error="no account")
    removed = _of_a_removed_actor()
    last = dead_letter(key="b", error="no account")
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError, match="1 dead letter\\(s\\) not replayed"):
        call_command("deadletters", "replay", "--id", str(first.pk), str(removed.pk), str(last.pk), "--yes",
                     stdout=out, stderr=err)
    assert "replayed 2 of 3" in out.getvalue()
    assert "1 refused: unknown actor 'charge_v1_removed'" in err.getvalue() and f"ids {removed.pk}" in err.getvalue()
    statuses = dict(DeadLetter.objects.values_list("pk", "status"))
    assert statuses == {first.pk: "replayed", removed.pk: "dead", last.pk: "replayed"}
    assert OutboxMessage.objects.count() == 2


@pytest.mark.django_db
def test_a_dry_run_refuses_what_the_run_would_and_publishes_nothing() -> None:
    good = dead_letter(key="good", error="no account")
    removed = _of_a_removed_actor()
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError, match=r"1 dead letter\(s\) would not be replayed"):
        call_command("deadletters", "replay", "--id", str(good.pk), str(removed.pk), "--dry-run",
                     stdout=out, stderr=err)
    assert "1 of 2 dead letter(s) would be replayed (dry run)" in out.getvalue()
    assert "1 would be refused: unknown actor 'charge_v1_removed'" in err.getvalue()
    assert f"ids {removed.pk}" in err.getvalue()
    # Nothing happened: both still dead, nothing in the outbox.
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {"dead"}
    assert not OutboxMessage.objects.exists()
    out, _ = run("replay", "--id", str(good.pk), "--dry-run")
    assert "1 of 1 dead letter(s) would be replayed (dry run)" in out
    assert not OutboxMessage.objects.exists()


@pytest.mark.django_db
def test_the_command_exits_non_zero_when_it_did_not_do_everything_asked() -> None:
    letter = dead_letter(key="one")
    handled = dead_letter(key="two")
    run("discard", "--id", str(handled.pk))
    # Ids that are gone or handled are refused by name, not dropped in silence.
    err = StringIO()
    with pytest.raises(CommandError, match="2 dead letter\\(s\\) not replayed"):
        call_command("deadletters", "replay", "--id", str(letter.pk), str(handled.pk), "999999", "--yes",
                     stdout=StringIO(), stderr=err)
    assert "no such dead letter: ids 999999" in err.getvalue()
    assert f"already discarded: ids {handled.pk}" in err.getvalue()
    assert DeadLetter.objects.get(pk=letter.pk).status == "replayed"
    # A mistyped filter matches nothing: that is not a success either.
    with pytest.raises(CommandError, match="no open dead letter matches"):
        run("replay", "--fingerprint", "deadbeefdead", "--yes")
    with pytest.raises(CommandError, match="no open dead letter matches"):
        run("discard", "--actor", "no_such_actor", "--yes")
    # show names what it could not find, after showing what it could.
    out = StringIO()
    with pytest.raises(CommandError, match="no dead letter with id 999999"):
        call_command("deadletters", "show", "--id", str(letter.pk), "999999", "--json", stdout=out)
    assert [row["id"] for row in json.loads(out.getvalue())] == [letter.pk]


@pytest.mark.django_db
def test_the_count_names_a_max_id_that_keeps_the_replay_to_what_was_counted() -> None:
    counted = [dead_letter(key=f"c{index}") for index in range(2)]
    out, _ = run("replay", "--actor", "charge")
    assert f"2 dead letter(s) would be replayed: add --yes --max-id {counted[-1].pk}" in out
    arrived = dead_letter(key="later")  # fails while the operator reads the count
    out, _ = run("replay", "--actor", "charge", "--yes", "--max-id", str(counted[-1].pk))
    assert "replayed 2 of 2" in out
    assert DeadLetter.objects.get(pk=arrived.pk).status == "dead"


@pytest.mark.django_db
def test_what_the_count_and_the_dry_run_say_is_what_the_run_does() -> None:
    low, high = dead_letter(key="low"), dead_letter(key="high")
    # One --id with --max-id is a selection like any: the dry run and the run agree on it.
    with pytest.raises(CommandError, match=rf"nothing would be discarded \({high.pk}: does not match"):
        run("discard", "--id", str(high.pk), "--max-id", str(low.pk), "--dry-run")
    err = StringIO()
    with pytest.raises(CommandError, match=r"1 dead letter\(s\) not discarded"):
        call_command("deadletters", "discard", "--id", str(high.pk), "--max-id", str(low.pk), "--yes",
                     stdout=StringIO(), stderr=err)
    assert f"does not match --actor/--task/--error/--fingerprint/--max-id: ids {high.pk}" in err.getvalue()
    assert DeadLetter.objects.get(pk=high.pk).status == "dead"
    # An open letter left out by the other options is not "already dead".
    err = StringIO()
    with pytest.raises(CommandError, match="1 dead letter\\(s\\) not replayed"):
        call_command("deadletters", "replay", "--id", str(low.pk), str(high.pk), "--max-id", str(low.pk), "--yes",
                     stdout=StringIO(), stderr=err)
    assert f"1 refused: does not match --actor/--task/--error/--fingerprint/--max-id: ids {high.pk}" in err.getvalue()
    # A count or a dry run that finds nothing fails, as the run would.
    with pytest.raises(CommandError, match="no open dead letter matches"):
        run("replay", "--fingerprint", "3f2a9c")
    with pytest.raises(CommandError, match="999999: no such dead letter"):
        run("replay", "--id", "999999", "--dry-run")
    # A blank filter would select everything: refused.
    with pytest.raises(CommandError, match="--fingerprint is empty"):
        run("replay", "--fingerprint", " ", "--yes")
    assert DeadLetter.objects.get(pk=high.pk).status == "dead"


@pytest.mark.django_db
def test_the_summary_counts_every_id_asked_for() -> None:
    letter, handled = dead_letter(key="one"), dead_letter(key="two")
    run("discard", "--id", str(handled.pk))
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("deadletters", "replay", "--id", str(letter.pk), str(handled.pk), "--yes",
                     stdout=out, stderr=StringIO())
    assert "replayed 1 of 2 dead letter(s)" in out.getvalue()


@pytest.mark.django_db
def test_an_interrupted_bulk_replay_says_how_far_it_got(monkeypatch: pytest.MonkeyPatch) -> None:
    from composition.jobs import replay as service

    letters = [dead_letter(key=f"i{index}") for index in range(3)]
    real, done = service.replay, []

    def replay_then_interrupt(pk: int, **kwargs: object) -> DeadLetter:
        if len(done) == 2:
            # A replayed job failed again meanwhile, into the same group, then the operator's
            # Ctrl-C, during the third: a recount of the group would count that one as not done.
            dead_letter(key="failed-again")
            raise KeyboardInterrupt
        done.append(pk)
        return real(pk, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(service, "replay", replay_then_interrupt)
    with pytest.raises(CommandError, match=r"interrupted: 2 of 3 dead letter\(s\) replayed, 1 left") as raised:
        run("replay", "--actor", "charge", "--yes")
    assert raised.value.returncode == 130
    assert sorted(DeadLetter.objects.values_list("status", flat=True)) == ["dead", "dead", "replayed", "replayed"]
    assert OutboxMessage.objects.count() == 2
    assert {letter.pk for letter in letters} >= set(done)


@pytest.mark.django_db
def test_a_json_dry_run_names_what_the_run_would_refuse() -> None:
    dead_letter(key="fine")
    gone = dead_letter("removed_by_a_deploy", key="gone")
    out = StringIO()
    with pytest.raises(CommandError, match="1 dead letter"):
        call_command("deadletters", "replay", "--all", "--dry-run", "--json", stdout=out, stderr=StringIO())
    report = json.loads(out.getvalue())
    assert (report["dry_run"], report["count"], report["done_count"]) == (True, 2, 1)
    assert list(report["refused"]) == [str(gone.pk)]
    assert DeadLetter.objects.filter(status="dead").count() == 2 and not OutboxMessage.objects.exists()


def _operator() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("ops", "ops@example.invalid", "pw"))
    return client


def _confirm(client: Client, selection: dict[str, object]) -> tuple[bytes, str]:
    page = client.post(URL, selection)
    assert page.status_code == 200
    upto = re.search(rb'name="upto" value="(\d+)"', page.content)
    assert upto is not None
    return page.content, upto.group(1).decode()


@pytest.mark.django_db
def test_the_admin_acts_on_what_its_confirmation_counted_not_on_what_failed_since() -> None:
    counted = [dead_letter(key=f"k{index}") for index in range(3)]
    client = _operator()
    selection = {"action": "replay_selected", "_selected_action": [counted[0].pk], "select_across": "1"}
    page, upto = _confirm(client, selection)
    assert b"Yes, replay 3" in page
    arrived = dead_letter(key="arrived")
    done = client.post(URL, {**selection, "confirm": "yes", "upto": upto}, follow=True)
    assert {row.pk for row in DeadLetter.objects.filter(status="replayed")} == {row.pk for row in counted}
    assert DeadLetter.objects.get(pk=arrived.pk).status == "dead"
    assert b"1 more open dead letter(s) match this selection" in done.content
    left = [m for m in done.context["messages"] if "more open dead letter" in m.message]
    assert [m.level_tag for m in left] == ["warning"]  # work left, not read as done
    # A confirmation without the count's bound (a hand-made POST) does nothing.
    client.post(URL, {**selection, "confirm": "yes"})
    assert DeadLetter.objects.get(pk=arrived.pk).status == "dead"


@pytest.mark.django_db
def test_one_admin_action_takes_a_bounded_batch_and_groups_its_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dead_letter_admin, "BULK_ACTION_LIMIT", 3)
    removed = [_of_a_removed_actor() for _ in range(2)]
    fine = [dead_letter(key=f"f{index}") for index in range(2)]
    client = _operator()
    selection = {"action": "replay_selected", "_selected_action": [removed[0].pk], "select_across": "1"}
    page, upto = _confirm(client, selection)
    assert b"Yes, replay 3" in page and b"run it again for the other 1" in page
    done = client.post(URL, {**selection, "confirm": "yes", "upto": upto}, follow=True)
    assert done.status_code == 200
    text = done.content.decode()
    assert text.count("refused: unknown actor") == 1, "one line per reason, not per row"
    assert "2 dead letter(s) refused: unknown actor &#x27;charge_v1_removed&#x27;" in text
    assert DeadLetter.objects.get(pk=fine[0].pk).status == "replayed"
    assert DeadLetter.objects.get(pk=fine[1].pk).status == "dead", "beyond the batch: the next click's"
    assert "1 more open dead letter(s) match" in text


@pytest.mark.parametrize("command", [["deadletters", "list"], ["deadletters", "replay", "--id", "1"],
                                     ["outbox", "status"]])
def test_with_the_database_away_the_commands_say_so_in_one_line(command: list[str]) -> None:
    away = subprocess_env(DATABASE_URL=f"postgresql://postgres@127.0.0.1:{free_port()}/none")
    result = subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=away, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "the database did not answer (connection failed" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr


@pytest.mark.django_db(transaction=True)
def test_two_bulk_replays_of_one_group_at_once_replay_each_letter_once_and_their_reports_add_up() -> None:
    # Two operators (or a runbook run twice) replaying the same group: each letter is published
    # again once, by one of them, and each report accounts for every letter it counted.
    letters = [dead_letter(key=f"race{index}", error="gateway down") for index in range(200)]
    env = subprocess_env()
    command = [sys.executable, "manage.py", "deadletters", "replay", "--actor", "charge", "--yes", "--json"]
    runs = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    reports = []
    for each in runs:
        out, err = each.communicate(timeout=120)
        assert "Traceback" not in err, err
        reports.append(json.loads(out))
    ids = {letter.pk for letter in letters}
    done = [set(report["done"]) for report in reports]
    assert done[0].isdisjoint(done[1]), reports
    assert done[0] | done[1] == ids, reports
    for report, its_done in zip(reports, done, strict=True):
        refused = {int(pk) for pk in report["refused"]}
        assert set(report["refused"].values()) <= {"already replayed"}, report["refused"]
        # What it counted, it reports: done or refused, none lost from its summary.
        assert len(its_done) + len(refused) == report["count"], report
        assert refused <= ids - its_done
    assert OutboxMessage.objects.count() == len(ids)  # published again once each
    assert set(DeadLetter.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"replayed"}
    assert DeadLetter.objects.filter(pk__in=ids).values("replay_outbox_id").distinct().count() == len(ids)
