"""The queues on the operations page: each one's state, and pause and resume for who may, each
change in the admin's history of its ``Pause`` row; the relay's queue has no button."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.db import transaction

from composition.jobs.models import DeadLetter
from composition.outbox import publish
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.pauses import Pause
from composition.sampling import open_dead_letters_by_actor
from composition.testing import left_to_the_relay
from tests.helpers import staff_client, table_row
from tests.jobsapp import jobs

pytestmark = pytest.mark.django_db

PAGE = "/admin/composition/operations/"
POST = "/admin/composition/operations/queue/"
QUEUE = jobs.PAUSE_QUEUE


def test_an_operator_who_may_pauses_and_resumes_a_queue_from_the_page() -> None:
    client = staff_client("view_operations", "change_pauses")
    page = client.get(PAGE).content.decode()
    row = table_row(page, "data-queue", QUEUE)
    assert "running" in row and 'value="Pause"' in row
    # The page's own reload switch does not read like a queue's state.
    assert "Paused." not in page and "Stop reloading" in page

    answer = client.post(POST, {"name": QUEUE, "action": "pause", "reason": "provider outage"}, follow=True)
    assert f"Queue {QUEUE} paused." in answer.content.decode()
    row = table_row(answer.content.decode(), "data-queue", QUEUE)
    assert "paused by" in row and "provider outage" in row and 'value="Resume"' in row
    pause_row = Pause.objects.get(kind=Pause.QUEUE, name=QUEUE)
    # Said as the command says it: a new reason of a queue paused already is not recorded.
    again = client.post(POST, {"name": QUEUE, "action": "pause", "reason": "another"}, follow=True).content.decode()
    assert re.search(rf"Queue {QUEUE} was paused already \(by op\w+: provider outage\); the new reason is not "
                     "recorded", again)
    client.post(POST, {"name": QUEUE, "action": "resume"})
    assert not Pause.objects.get(pk=pause_row.pk).paused
    assert f"Queue {QUEUE} was not paused." in client.post(POST, {"name": QUEUE, "action": "resume"},
                                                           follow=True).content.decode()
    history = list(LogEntry.objects.filter(object_id=str(pause_row.pk)).order_by("pk")
                   .values_list("change_message", flat=True))
    assert history == ["Paused: provider outage", "Resumed"]


def test_a_reason_is_typed_on_the_page_that_does_not_reload() -> None:
    """The reloading page has no field its reload would wipe; without reloads it has one, and a
    change made there comes back to the page without reloads."""
    client = staff_client("view_operations", "change_pauses")
    live = table_row(client.get(PAGE).content.decode(), "data-queue", QUEUE)
    assert 'name="reason"' not in live and 'href="?refresh=off"' in live and 'value="Pause"' in live
    still = client.get(PAGE + "?refresh=off").content.decode()
    assert 'name="reason"' in table_row(still, "data-queue", QUEUE) and 'http-equiv="refresh"' not in still
    answer = client.post(POST, {"name": QUEUE, "action": "pause", "reason": "provider outage", "refresh": "off"})
    assert answer["Location"] == PAGE + "?refresh=off"
    assert client.post(POST, {"name": QUEUE, "action": "resume"})["Location"] == PAGE


def test_without_the_permission_there_is_no_button_and_a_post_is_refused() -> None:
    client = staff_client("view_operations")
    assert 'value="Pause"' not in table_row(client.get(PAGE).content.decode(), "data-queue", QUEUE)
    assert client.post(POST, {"name": QUEUE, "action": "pause"}).status_code == 403
    assert not Pause.objects.filter(kind=Pause.QUEUE).exists()


def test_an_unknown_queue_the_relay_s_queue_or_an_unknown_action_changes_nothing() -> None:
    client = staff_client("view_operations", "change_pauses")
    for data, says in (({"name": "nope", "action": "pause"}, "no queue named &#x27;nope&#x27;"),
                       ({"name": RELAY_QUEUE_NAME, "action": "pause"}, "outbox relay"),
                       ({"name": QUEUE, "action": "explode"}, "No action"),
                       # It was cut to 500 characters without a word, where the command kept it whole.
                       ({"name": QUEUE, "action": "pause", "reason": "x" * 501},
                        "A reason is at most 500 characters, got 501; nothing was changed.")):
        answer = client.post(POST, data, follow=True)
        html = answer.content.decode()
        assert says.lower() in html.lower(), re.findall(r'<ul class="messagelist">.*?</ul>', html, re.S)
    assert not Pause.objects.exists()
    assert client.get(POST).status_code == 405


@pytest.mark.django_db(transaction=True)
@pytest.mark.empty_queues(QUEUE)
def test_a_paused_queue_is_purged_after_a_confirmation_page_and_the_purge_is_in_its_history() -> None:
    client = staff_client("view_operations", "change_pauses", "view_deadletter")
    purge = "/admin/composition/operations/purge/"
    assert "Purge" not in table_row(client.get(PAGE).content.decode(), "data-queue", QUEUE)  # running: no link
    not_paused = client.get(purge, {"name": QUEUE}).content.decode()
    assert f"Queue <strong>{QUEUE}</strong> is not paused: pause it first" in not_paused
    assert "Yes, purge" not in not_paused

    with left_to_the_relay(), transaction.atomic():
        for key in ("a", "b", "c"):
            publish(jobs.pause_run, {"key": key, "hold_s": 0.0})
    client.post(POST, {"name": QUEUE, "action": "pause", "reason": "bad deploy"})
    row = table_row(client.get(PAGE).content.decode(), "data-queue", QUEUE)
    assert f'href="{purge}?name={QUEUE}"' in row
    confirm = client.get(purge, {"name": QUEUE}).content.decode()
    assert re.search(r"<strong>3</strong> outbox rows not yet sent and\s+<strong>0</strong> broker messages wait",
                     confirm) and f'value="Yes, purge {QUEUE}"' in confirm
    assert not DeadLetter.objects.exists()  # the page only counts

    answer = client.post(purge, {"name": QUEUE, "reason": "ticket 7"}, follow=True).content.decode()
    assert f"Queue {QUEUE} purged: 3 dead letters (3 from the outbox, 0 from the broker)" in answer
    letters = DeadLetter.objects.filter(queue=QUEUE)
    assert letters.count() == 3 and {letter.error_message for letter in letters} == {
        f"purged from queue {QUEUE} by {User.objects.get(is_staff=True).username}: ticket 7"}
    pause_row = Pause.objects.get(kind=Pause.QUEUE, name=QUEUE)
    assert list(LogEntry.objects.filter(object_id=str(pause_row.pk)).order_by("pk")
                .values_list("change_message", flat=True)) == [
        "Paused: bad deploy", "Purged 3 waiting messages into dead letters: ticket 7"]
    # The page counts them as composition_dead_letters_open does (apart), and lists their group.
    page = client.get(PAGE)
    snapshot = page.context["snapshot"]
    assert (snapshot.open_dead_letters, snapshot.purged_dead_letters, sum(open_dead_letters_by_actor().values())) == (
        0, 3, 0)
    assert [group["count"] for group in snapshot.failure_groups] == [3]
    assert '<div id="ops-purged-dead-letters"><strong>3</strong>' in page.content.decode()
    assert staff_client("view_operations", username="viewer").post(purge, {"name": QUEUE}).status_code == 403
