"""Dead letters: recording, replay through the outbox (once), discard, the command and the admin."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from io import StringIO
from typing import Any

import django
import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import Client
from dramatiq import Message
from dramatiq.broker import MessageProxy

from composition.broker.configured import configured_broker
from composition.errors import DeadLetterStateError, PermanentError
from composition.jobs import replay as service
from composition.jobs.deadletters import fingerprint, record_dead_letter
from composition.jobs.models import DeadLetter, ProcessedMessage
from composition.outbox import OutboxMessage, publish
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.testing import current_database_url, subprocess_env, wait_until
from tests.helpers import ROOT
from tests.jobsapp import jobs
from tests.jobsapp.models import Account, Effect


def dead_letter(actor: str = "charge", *, account: str = "acme", key: str = "k",
                error: str = "no account") -> DeadLetter:
    """A dead letter recorded the way the worker records one, from a real Dramatiq message."""
    message = MessageProxy(Message(queue_name=jobs.CHECK_QUEUE, actor_name=actor, args=(),
                                   kwargs={"account": account, "key": key}, options={}))
    try:
        raise PermanentError(error)
    except PermanentError as exc:
        pk = record_dead_letter(message, exc, attempts=1)
    return DeadLetter.objects.get(pk=pk)


# -- replay and discard, in-process ----------------------------------------------------------------
@pytest.mark.django_db
def test_replay_publishes_through_the_outbox_once() -> None:
    letter = dead_letter(key="once")
    replayed = service.replay(letter.pk)
    assert replayed.status == "replayed" and replayed.replayed_at is not None
    outbox = OutboxMessage.objects.get(pk=replayed.replay_outbox_id)
    assert (outbox.actor_name, outbox.payload) == ("charge", {"account": "acme", "key": "once"})
    assert outbox.headers["idempotency_key"] == letter.message_id, "the ledger key of the original travels"
    with pytest.raises(DeadLetterStateError, match="already replayed"):
        service.replay(letter.pk)
    with pytest.raises(DeadLetterStateError, match="already replayed"):
        service.discard(letter.pk)
    assert OutboxMessage.objects.filter(actor_name="charge").count() == 1


@pytest.mark.django_db
def test_replaying_a_replay_keeps_the_original_idempotency_key() -> None:
    letter = dead_letter(key="twice-dead")
    first = OutboxMessage.objects.get(pk=service.replay(letter.pk).replay_outbox_id)
    # The replay failed for good too; its dead letter carries the relay's headers.
    message = MessageProxy(Message(queue_name=jobs.CHECK_QUEUE, actor_name="charge", args=(),
                                   kwargs=first.payload, options={"composition": first.headers},
                                   message_id=first.message_id))
    again = DeadLetter.objects.get(pk=record_dead_letter(message, PermanentError("still no account"), attempts=1))
    second = OutboxMessage.objects.get(pk=service.replay(again.pk).replay_outbox_id)
    assert second.headers["idempotency_key"] == letter.message_id


@pytest.mark.django_db
def test_replay_rolls_back_with_the_callers_transaction() -> None:
    letter = dead_letter(key="rollback")
    with pytest.raises(RuntimeError), transaction.atomic():
        service.replay(letter.pk)
        raise RuntimeError("operator's transaction failed")
    letter.refresh_from_db()
    assert letter.status == "dead" and letter.replay_outbox_id is None
    assert not OutboxMessage.objects.filter(actor_name="charge").exists()


@pytest.mark.django_db
def test_replay_and_discard_need_their_permissions() -> None:
    user = User.objects.create_user("viewer")
    letter = dead_letter(key="perm")
    with pytest.raises(service.PermissionDenied):
        service.replay(letter.pk, user=user)
    with pytest.raises(service.PermissionDenied):
        service.discard(letter.pk, user=user)
    user.user_permissions.add(Permission.objects.get(codename="discard_deadletter"))
    user = User.objects.get(pk=user.pk)  # permissions are cached per instance
    assert service.discard(letter.pk, user=user).discarded_by == user


@pytest.mark.django_db
def test_same_failure_refreshes_one_row() -> None:
    first = dead_letter(key="same")
    message = MessageProxy(Message(queue_name=jobs.CHECK_QUEUE, actor_name="charge", args=(),
                                   kwargs={}, options={}, message_id=first.message_id))
    record_dead_letter(message, PermanentError("again"), attempts=2)
    first.refresh_from_db()
    assert (first.attempts, first.error_message) == (2, "again")
    assert DeadLetter.objects.filter(message_id=first.message_id).count() == 1


# -- the command ------------------------------------------------------------------------------------
def run(*args: str) -> str:
    out = StringIO()
    call_command("deadletters", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_command_bulk_action_without_yes_only_prints_the_count() -> None:
    letters = [dead_letter(key=f"bulk-{index}", error=f"no account {index}") for index in range(3)]
    dead_letter("other_actor", key="other")
    assert "3 dead letter(s) would be replayed" in run("replay", "--actor", "charge")
    assert "3 of 3 dead letter(s) would be discarded (dry run)" in run("discard", "--actor", "charge", "--yes",
                                                                       "--dry-run")
    assert DeadLetter.objects.filter(status="dead").count() == 4
    assert not OutboxMessage.objects.exists()

    fingerprint = letters[0].fingerprint
    assert all(letter.fingerprint == fingerprint for letter in letters), "numbers are normalised away"
    groups = json.loads(run("list", "--json"))["groups"]
    assert (groups[0]["fingerprint"], groups[0]["actor"], groups[0]["count"]) == (fingerprint, "charge", 3)
    assert [g["count"] for g in groups] == [3, 1]
    listed = run("list")
    assert f"x3      {fingerprint[:12]}" in listed
    # Each group line shows a sample of its messages: two groups of one actor and error class
    # are told apart by it.
    # Each group line ends with a sample of its messages, which tells apart groups of one actor
    # and error class (their fingerprints do not, to a reader).
    header, first_group = listed.splitlines()[:2]
    assert header.endswith("SAMPLE MESSAGE") and first_group.endswith(" no account 2")
    result = json.loads(run("replay", "--fingerprint", fingerprint, "--yes", "--json"))
    assert (result["count"], result["done_count"], result["refused_count"]) == (3, 3, 0)
    assert OutboxMessage.objects.filter(actor_name="charge").count() == 3
    assert json.loads(run("list", "--json"))["count"] == 1
    assert json.loads(run("list", "--all", "--json"))["count"] == 4


@pytest.mark.django_db
def test_command_single_actions_and_refusals() -> None:
    letter = dead_letter(key="single")
    shown = json.loads(run("show", "--id", str(letter.pk), "--json"))[0]
    assert "PermanentError" in shown["traceback"] and shown["payload"] == {"account": "acme", "key": "single"}
    assert "discarded" in run("discard", "--id", str(letter.pk))
    with pytest.raises(CommandError, match="already discarded"):
        run("replay", "--id", str(letter.pk))
    with pytest.raises(CommandError, match="needs --id, a filter"):
        run("replay")
    with pytest.raises(CommandError, match="no dead letter with id"):
        run("discard", "--id", "999999")
    with pytest.raises(CommandError, match=f"no dead letter with id {letter.pk} that matches the filters"):
        run("show", "--id", str(letter.pk), "--actor", "another_actor")
    for args, says in ((("list", "--older-than", "3"), "--older-than is for prune, not list"),
                       (("list", "--yes"), "--yes is for replay and discard, not list"),
                       (("prune", "--yes"), "--yes is for replay and discard, not prune"),
                       (("show", "--id", str(letter.pk), "--dry-run"), "--dry-run is for replay and discard and prune"),
                       (("prune", "--max-id", "3"), "--max-id is for replay and discard, not prune")):
        with pytest.raises(CommandError, match=says):
            run(*args)



@pytest.mark.django_db
def test_command_records_who_acts_with_by_and_checks_their_permission() -> None:
    # Replays and discards from the shell recorded no one: the admin's record of who did what had
    # a hole for every operator who used the runbook's commands.
    operator = User.objects.create_user("night-operator")
    operator.user_permissions.add(Permission.objects.get(codename="replay_deadletter"))
    one, group = dead_letter(key="by-one"), [dead_letter(key=f"by-{index}") for index in range(2)]
    run("replay", "--id", str(one.pk), "--by", "night-operator")
    run("replay", "--id", *(str(letter.pk) for letter in group), "--by", "night-operator", "--yes")
    assert {letter.replayed_by for letter in DeadLetter.objects.filter(status="replayed")} == {operator}
    spare = dead_letter(key="by-spare")
    with pytest.raises(CommandError, match=r"--by night-operator: composition\.discard_deadletter is required"):
        run("discard", "--id", str(spare.pk), "--by", "night-operator")  # replay only
    with pytest.raises(CommandError, match="--by nobody-here: no Django user has that username"):
        run("discard", "--id", str(spare.pk), "--by", "nobody-here")
    with pytest.raises(CommandError, match="--by is for replay and discard, not list"):
        run("list", "--by", "night-operator")
    assert DeadLetter.objects.get(pk=spare.pk).status == "dead"


# -- the admin --------------------------------------------------------------------------------------
def _staff(name: str, *codenames: str) -> Client:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    for codename in ("view_deadletter", *codenames):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_admin_replay_is_refused_without_the_permission() -> None:
    letter = dead_letter(key="admin-no")
    client = _staff("viewer")
    url = "/admin/composition/deadletter/"
    page = client.get(url)
    assert page.status_code == 200 and b"replay_selected" not in page.content
    response = client.post(url, {"action": "replay_selected", "_selected_action": [letter.pk], "confirm": "yes"})
    assert response.status_code in (200, 302)
    letter.refresh_from_db()
    assert letter.status == "dead"
    assert not OutboxMessage.objects.exists()


@pytest.mark.django_db
def test_admin_replay_confirms_the_count_then_acts() -> None:
    letters = [dead_letter(key=f"admin-{index}") for index in range(2)]
    client = _staff("operator", "replay_deadletter")
    url = "/admin/composition/deadletter/"
    assert b"replay_selected" in client.get(url).content
    detail = client.get(f"{url}{letters[0].pk}/change/")
    assert detail.status_code == 200 and b"Traceback" in detail.content
    # "Show counts" (Django 5+) counts each status, the default open one included.
    if django.VERSION >= (5, 0):
        counted = client.get(f"{url}?_facets=True").content.decode()
        assert re.search(r">\s*dead \(2\)\s*<", counted) and re.search(r">\s*All \(2\)\s*<", counted), counted
        assert not re.search(r"\(\d+\) \((\d+|-)\)", counted), "a failure group counted twice"
    # Its moments to the second, as the list shows them, for an incident's timeline.
    from composition.admin.format import moment

    assert moment(letters[0].first_failed_at).encode() in detail.content
    # Its replay at hand on its own page (this operator may replay, not discard).
    assert b'value="replay_selected"' in detail.content and b'value="discard_selected"' not in detail.content
    from_detail = client.post(url, {"action": "replay_selected", "_selected_action": [letters[0].pk], "index": "0"})
    assert b"This will replay <strong>1</strong> dead letter" in from_detail.content
    selection = {"action": "replay_selected", "_selected_action": [letter.pk for letter in letters]}
    confirm = client.post(url, selection)
    assert confirm.status_code == 200
    assert b"This will replay <strong>2</strong> dead letters" in confirm.content
    assert DeadLetter.objects.filter(status="dead").count() == 2, "nothing happens before the confirmation"
    upto = re.search(rb'name="upto" value="(\d+)"', confirm.content)
    assert upto is not None and int(upto.group(1)) == letters[-1].pk
    done = client.post(url, {**selection, "confirm": "yes", "upto": upto.group(1).decode()})
    assert done.status_code == 302
    assert DeadLetter.objects.filter(status="replayed").count() == 2
    assert OutboxMessage.objects.filter(actor_name="charge").count() == 2
    from django.contrib.admin.models import LogEntry

    history = client.get(f"{url}{letters[0].pk}/history/").content.decode()
    assert "Replayed from the admin." in history  # who did what, in the letter's own history
    assert LogEntry.objects.filter(user__username="operator").count() == 2

    # The same confirmation again (a double click, Back and submit): said, and nothing done twice.
    again = client.post(url, {**selection, "confirm": "yes", "upto": upto.group(1).decode()}, follow=True)
    assert b"Nothing to replay: the selected dead letters were replayed, discarded or deleted already." in again.content
    assert OutboxMessage.objects.filter(actor_name="charge").count() == 2
    # And asked again for rows handled meanwhile: no "replay 0" button, a way back to the same filter.
    filtered = f"{url}?fingerprint={letters[0].fingerprint}"
    stale = client.post(filtered, selection)
    assert b"Nothing to replay" in stale.content and b'name="confirm"' not in stale.content
    assert f'href="{filtered}"'.encode() in stale.content
    # A selection that is not ids (a forged or mangled form) was a 500 from inside the ORM.
    mangled = client.post(url, {"action": "replay_selected", "_selected_action": ["abc"], "index": "0"}, follow=True)
    assert mangled.status_code == 200
    assert b"The selection held something that is not a dead letter&#x27;s id; nothing was done." in mangled.content


# -- fix the data, replay, once: with a real worker and relay ------------------------------------------
def _charge_until_dead_lettered(worker_processes, *, account: str, key: str) -> tuple[Any, DeadLetter]:  # type: ignore[no-untyped-def]
    """A real worker runs ``charge`` for an account that does not exist yet, until it is dead-lettered."""
    worker = worker_processes.spawn(["--threads", "4", "--queues", f"{jobs.CHECK_QUEUE},{RELAY_QUEUE_NAME}"])
    with transaction.atomic():
        publish(jobs.charge, {"account": account, "key": key})
    try:
        wait_until(lambda: DeadLetter.objects.filter(actor="charge").exists(), timeout_s=30)
    except AssertionError:
        pytest.fail(f"no dead letter; log:\n{worker.output()[-3000:]}")
    return worker, DeadLetter.objects.get(actor="charge")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.empty_queues(jobs.CHECK_QUEUE, RELAY_QUEUE_NAME)
def test_replay_after_fixing_the_data_succeeds_once(worker_processes) -> None:
    worker, letter = _charge_until_dead_lettered(worker_processes, account="acme", key="charged")
    assert letter.error_message == "no account named acme"
    first_outbox = OutboxMessage.objects.get(actor_name="charge")
    assert letter.headers["outbox_id"] == first_outbox.pk, "the relay's headers travel with the message"
    assert letter.message_id == first_outbox.message_id

    Account.objects.create(name="acme")  # the operator fixes the data
    replayed = service.replay(letter.pk)
    wait_until(lambda: Effect.objects.filter(key="charged").exists(), timeout_s=30,
               message="the replayed job did not run")
    with pytest.raises(DeadLetterStateError):
        service.replay(letter.pk)
    with pytest.raises(CommandError, match="already replayed"):
        run("replay", "--id", str(letter.pk))
    outbox = OutboxMessage.objects.get(pk=replayed.replay_outbox_id)
    wait_until(lambda: OutboxMessage.objects.get(pk=outbox.pk).status == "sent", timeout_s=10)
    assert Effect.objects.filter(key="charged").count() == 1
    assert DeadLetter.objects.filter(actor="charge").count() == 1
    # The ledger holds the original message id: a late redelivery of it would be skipped.
    assert list(ProcessedMessage.objects.filter(actor="charge").values_list("message_id", flat=True)) \
        == [letter.message_id]
    assert worker.terminate() == 0


def _in_queue(queue: str) -> int:
    broker = configured_broker()
    client = broker.client  # type: ignore[attr-defined]
    return sum(int(client.hlen(f"{broker.namespace}:{name}.msgs")) for name in (queue, f"{queue}.DQ"))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.empty_queues(jobs.CHECK_QUEUE, RELAY_QUEUE_NAME)
def test_replay_after_a_late_redelivery_has_no_second_effect(worker_processes) -> None:
    worker, letter = _charge_until_dead_lettered(worker_processes, account="late", key="late-charge")
    Account.objects.create(name="late")  # the data gets fixed...

    # ...and the original message comes back late (its worker was killed after writing the dead
    # letter, before the broker's acknowledgement), with its own id: it runs, once.
    configured_broker().enqueue(Message(
        queue_name=jobs.CHECK_QUEUE, actor_name="charge", args=(), kwargs=letter.payload,
        options={"composition": letter.headers}, message_id=letter.message_id))
    wait_until(lambda: Effect.objects.filter(key="late-charge").exists(), timeout_s=30,
               message="the late redelivery did not run")

    # The operator replays the dead letter anyway: the replay runs but has no second effect.
    replayed = service.replay(letter.pk)
    wait_until(lambda: OutboxMessage.objects.get(pk=replayed.replay_outbox_id).status == "sent"
               and _in_queue(jobs.CHECK_QUEUE) == 0, timeout_s=30,
               message=f"the replay was not processed; log:\n{worker.output()[-3000:]}")
    assert Effect.objects.filter(key="late-charge").count() == 1
    assert list(ProcessedMessage.objects.filter(actor="charge").values_list("message_id", flat=True)) \
        == [letter.message_id]
    assert "already processed" in worker.output()
    assert worker.terminate() == 0


@pytest.mark.django_db
def test_command_takes_several_ids_after_one_flag_or_repeated() -> None:
    first, second, third = (dead_letter(key=f"ids-{index}") for index in range(3))
    assert "2 dead letter(s) would be discarded" in run("discard", "--id", str(first.pk), str(second.pk))
    run("discard", "--id", str(first.pk), str(second.pk), "--id", str(third.pk), "--yes")
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {"discarded"}


@pytest.mark.django_db
def test_nul_characters_do_not_stop_a_dead_letter_from_being_written() -> None:
    # PostgreSQL text and jsonb refuse NUL: unrecorded, such a failure would requeue and rerun
    # its job forever, or vanish into the broker's expiring dead-letter queue.
    message = MessageProxy(Message(queue_name=jobs.CHECK_QUEUE, actor_name="charge", args=("a\x00b",),
                                   kwargs={"note": "x\x00y", "nested": {"k\x00": ["\x00"]}}, options={}))
    row_id = record_dead_letter(message, PermanentError("bad byte \x00 in input"), attempts=1)
    row = DeadLetter.objects.get(pk=row_id)
    assert row.error_message == "bad byte \ufffd in input"
    assert row.payload == {"note": "x\ufffdy", "nested": {"k\ufffd": ["\ufffd"]}}
    assert row.args == ["a\ufffdb"]
    assert "\x00" not in row.traceback


@pytest.mark.django_db
def test_lone_surrogates_and_nan_do_not_stop_a_dead_letter_from_being_written() -> None:
    # A file name or a process's output decoded with surrogateescape, and a float a direct
    # actor.send() let through: UTF-8 text and jsonb refuse both, and the letter was lost.
    name = b"caf\xe9".decode("utf-8", "surrogateescape")
    message = MessageProxy(Message(queue_name=jobs.CHECK_QUEUE, actor_name="charge", args=(name,),
                                   kwargs={"file": name, "ratio": float("nan"), "emoji": "\ud83d\ude00"},
                                   options={}))
    row_id = record_dead_letter(message, PermanentError(f"no account named {name}"), attempts=1)
    row = DeadLetter.objects.get(pk=row_id)
    assert row.error_message == "no account named caf\ufffd"
    assert row.payload == {"file": "caf\ufffd", "ratio": "nan", "emoji": "\U0001f600"}
    assert row.args == ["caf\ufffd"]
    assert "\ufffd" in row.traceback


@pytest.mark.django_db
def test_bidirectional_controls_in_an_error_are_written_out() -> None:
    # One U+202E reversed what the admin and a terminal showed after it ("RTL" read "LTR").
    letter = dead_letter(key="bidi", error="refund to \u202eRTL\u202c account")
    assert letter.error_message == "refund to \\u202eRTL\\u202c account"
    assert "\u202e" not in letter.traceback and "\\u202e" in letter.traceback


@pytest.mark.django_db
def test_show_says_who_acted_and_prints_json_and_list_keeps_a_letter_to_one_line() -> None:
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_superuser("oncall", "oncall@example.com", "unused")
    letter = dead_letter(key="who", error="duplicate key\nDETAIL:  Key (token)=(x) already exists.")
    run("discard", "--id", str(letter.pk), "--by", "oncall")
    shown = run("show", "--id", str(letter.pk))
    assert "discarded_by: oncall" in shown and "replayed_by: None" in shown
    assert 'payload: {"account": "acme", "key": "who"}' in shown  # JSON, not a Python repr
    assert json.loads(run("show", "--id", str(letter.pk), "--json"))[0]["discarded_by"] == "oncall"
    from django.contrib.admin.models import LogEntry

    (entry,) = LogEntry.objects.filter(object_id=str(letter.pk), user__username="oncall")
    assert entry.change_message == "Discarded with manage.py deadletters."  # the admin's history, as there
    listed = run("list", "--all").splitlines()
    (row,) = [line for line in listed if line.split()[:1] == [str(letter.pk)]]
    assert row.endswith("duplicate key DETAIL: Key (token)=(x) already exists.")
    assert not any(line.startswith("DETAIL") for line in listed)


# -- the operator's tools as a newcomer meets them ---------------------------------------------------
def _command(*args: str) -> str:
    out = StringIO()
    call_command("deadletters", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_a_fingerprint_prefix_as_list_shows_it_replays_exactly_its_group() -> None:
    group = [dead_letter(error="no account", key=f"k{n}") for n in range(3)]
    other = dead_letter(error="card declined", key="other")
    assert group[0].fingerprint != other.fingerprint
    listing = _command("list")
    assert listing.splitlines()[0].split() == ["COUNT", "FINGERPRINT", "ACTOR", "OR", "TASK", "ERROR", "LAST",
                                               "FAILED", "SAMPLE", "MESSAGE"]
    # A job's letter names no task, and its group is the actor's, as before there were tasks.
    assert (group[0].task_path, group[0].fingerprint) == ("", fingerprint("charge", group[0].error_class,
                                                                          "no account"))
    assert "ID" in listing and "STATUS" in listing and "MESSAGE" in listing
    prefix = group[0].fingerprint[:12]
    assert prefix in listing

    assert "3 dead letter(s) would be replayed" in _command("replay", "--fingerprint", prefix)
    assert "replayed 3 of 3" in _command("replay", "--fingerprint", prefix, "--yes")
    assert set(DeadLetter.objects.filter(pk__in=[row.pk for row in group]).values_list("status", flat=True)) == {
        "replayed"}
    other.refresh_from_db()
    assert other.status == "dead"


@pytest.mark.django_db
def test_an_ambiguous_fingerprint_prefix_is_refused_naming_the_candidates() -> None:
    first, second = dead_letter(error="first", key="a"), dead_letter(error="second", key="b")
    # Two groups whose fingerprints share a prefix, as happens by chance at a few characters.
    DeadLetter.objects.filter(pk=first.pk).update(fingerprint="abc1" + "0" * 28)
    DeadLetter.objects.filter(pk=second.pk).update(fingerprint="abc2" + "0" * 28)
    with pytest.raises(CommandError, match="matches 2 groups") as refused:
        _command("replay", "--fingerprint", "abc", "--yes")
    assert "abc1" in str(refused.value) and "abc2" in str(refused.value)
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {"dead"}
    assert "replayed 1 of 1" in _command("replay", "--fingerprint", "abc1", "--yes")


@pytest.mark.django_db
def test_a_replay_keeps_the_original_outbox_key() -> None:
    letter = dead_letter(key="keyed")
    DeadLetter.objects.filter(pk=letter.pk).update(headers={"outbox_id": 7, "key": "invoice:42"})
    replayed = service.replay(letter.pk)
    assert OutboxMessage.objects.get(pk=replayed.replay_outbox_id).key == "invoice:42"


@pytest.mark.django_db
def test_the_admin_lists_open_dead_letters_by_default(admin_client: Client) -> None:
    open_letter, handled = dead_letter(key="open"), dead_letter(key="handled")
    service.discard(handled.pk)
    page = admin_client.get("/admin/composition/deadletter/")
    assert page.status_code == 200
    ids = {row.pk for row in page.context["cl"].result_list}
    assert ids == {open_letter.pk}
    everything = admin_client.get("/admin/composition/deadletter/?status=all")
    assert {row.pk for row in everything.context["cl"].result_list} == {open_letter.pk, handled.pk}
    # One status shown: no status column repeating it on every row; "All" has one.
    assert "column-status" not in page.content.decode() and "column-status" in everything.content.decode()
    # The error's class and its message share a column (the list fits beside the admin's sidebar).
    assert f"<strong>{open_letter.error_class.rsplit('.', 1)[-1]}</strong> {open_letter.error_message}" \
        in page.content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_listing_whose_reader_went_away_stops_quietly() -> None:
    # "deadletters list | head" ended in a BrokenPipeError traceback.
    dead_letter(key="piped")
    process = subprocess.Popen([sys.executable, "manage.py", "deadletters", "list"], cwd=ROOT,
                               env=subprocess_env(DATABASE_URL=current_database_url()),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None
    process.stdout.close()  # the reader leaves before the first line, as head does after its own
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1 and b"Traceback" not in stderr and b"BrokenPipe" not in stderr, stderr
