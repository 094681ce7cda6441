"""The outbox's admin action: jobs not yet sent are cancelled after a confirmation page, with
each payload kept in the admin's history; sent ones are left, and only who may delete rows acts."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import DELETION, LogEntry
from django.db import transaction

from composition.broker.configured import configured_broker
from composition.outbox import OutboxMessage, publish
from composition.outbox.relay import Relay
from composition.testing import left_to_the_relay
from tests.helpers import staff_client

PROBE = "outboxapp_relay_probe"
QUEUE = "outboxapp_probe"
LIST = "/admin/composition/outboxmessage/"

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.empty_queues(QUEUE)]


def test_selected_jobs_not_yet_sent_are_cancelled_after_a_confirmation_and_sent_ones_are_left() -> None:
    with left_to_the_relay():
        sent = publish(PROBE, {"seq": 1})
        Relay(configured_broker()).run_until_idle()
        with transaction.atomic():
            held = publish(PROBE, {"seq": 2, "note": "remind"}, delay_s=7200)
            pending = publish(PROBE, {"seq": 3})
    selected = [str(row.pk) for row in (sent, held, pending)]
    client = staff_client("view_outboxmessage", "delete_outboxmessage")

    confirm = client.post(LIST, {"action": "cancel_selected", "_selected_action": selected}).content.decode()
    assert "This will cancel <strong>2</strong> jobs not yet sent" in confirm
    assert "1 selected job that a relay has sent or tried to send will be left alone" in confirm
    assert f"<td>{PROBE}</td><td>2</td>" in confirm and 'value="Yes, cancel 2"' in confirm
    assert OutboxMessage.objects.count() == 3  # the page only counts

    done = client.post(LIST, {"action": "cancel_selected", "_selected_action": selected, "confirm": "yes"},
                       follow=True).content.decode()
    assert "Cancelled 2 job(s)." in done and "1 selected job(s) not cancelled: a relay has sent them" in done
    assert list(OutboxMessage.objects.values_list("pk", flat=True)) == [sent.pk]
    history = LogEntry.objects.filter(action_flag=DELETION).order_by("object_id")
    assert [(entry.object_id, entry.object_repr, entry.change_message) for entry in history] == [
        (str(held.pk), f'cancelled: outbox #{held.pk} {PROBE} {{"note": "remind", "seq": 2}}',
         f'Cancelled from the admin: {PROBE} {{"note": "remind", "seq": 2}}'),
        (str(pending.pk), f'cancelled: outbox #{pending.pk} {PROBE} {{"seq": 3}}',
         f'Cancelled from the admin: {PROBE} {{"seq": 3}}')]
    assert f'cancelled: outbox #{held.pk} {PROBE}' in client.get("/admin/").content.decode()  # Recent actions
    again = client.post(LIST, {"action": "cancel_selected", "_selected_action": selected[1:], "confirm": "yes"},
                        follow=True).content.decode()  # the same confirmation, submitted twice
    assert "Nothing to cancel: the selected jobs were cancelled already." in again


def test_who_may_not_delete_outbox_rows_is_not_offered_the_action_and_cannot_post_it() -> None:
    row = publish(PROBE, {"seq": 1}, delay_s=7200)
    viewer = staff_client("view_outboxmessage", username="viewer")
    assert 'value="cancel_selected"' not in viewer.get(LIST).content.decode()
    viewer.post(LIST, {"action": "cancel_selected", "_selected_action": [str(row.pk)], "confirm": "yes"})
    assert OutboxMessage.objects.filter(pk=row.pk).exists()
