"""Operator surfaces of the outbox: the `outbox` command, the admin screen and the gauges."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import formats, timezone
from dramatiq.brokers.redis import RedisBroker
from prometheus_client import REGISTRY

from composition.outbox import OutboxMessage, publish
from composition.outbox.maintenance import prune_sent
from composition.testing import ThrowawayRedis
from tests.outboxapp.helpers import enqueued

PROBE = "outboxapp_relay_probe"
QUEUE = "outboxapp_probe"


pytestmark = [pytest.mark.empty_queues()]


def _outbox(*args: str) -> dict:  # type: ignore[type-arg]
    out = StringIO()
    call_command("outbox", *args, "--json", stdout=out)
    return json.loads(out.getvalue())  # type: ignore[no-any-return]


def _sent(days_ago: float, n: int) -> None:
    sent_at = timezone.now() - timedelta(days=days_ago)
    OutboxMessage.objects.bulk_create([
        OutboxMessage(actor_name=PROBE, queue_name=QUEUE, payload={"seq": i}, status="sent", sent_at=sent_at)
        for i in range(n)])


# -- command --------------------------------------------------------------------------------------------------
@pytest.mark.django_db
# Sent on commit, a row is inserted leased to the publisher, and this test's rows never commit.
@pytest.mark.usefixtures("nudge_only")
def test_status_reports_backlog_by_actor_and_sets_the_gauges() -> None:
    old = publish(PROBE, {"seq": 1})
    OutboxMessage.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(seconds=90))
    publish(PROBE, {"seq": 2})
    _sent(1, 3)
    status = _outbox("status")
    assert status["pending"] == 2 and status["sent"] == 3 and status["leased"] == 0
    assert status["pending_by_actor"] == {PROBE: 2}
    assert 90 <= status["oldest_pending_age_s"] < 120
    assert REGISTRY.get_sample_value("composition_outbox_pending_messages") == 2
    assert 90 <= REGISTRY.get_sample_value("composition_outbox_oldest_pending_age_seconds") < 120  # type: ignore[operator]


@pytest.mark.django_db
def test_with_nothing_pending_the_oldest_age_is_none_and_its_gauge_0() -> None:
    # It said 0.0 s, as if a row had just arrived; the page's card too. The gauge stays a number
    # for the alerts' arithmetic.
    _sent(0, 2)  # a queue with rows relayed recently and none pending
    status = _outbox("status")
    assert status["pending"] == 0 and status["oldest_pending_age_s"] is None
    assert status["queues"][QUEUE] == {"pending": 0, "oldest_pending_age_s": None, "relayed_recently": 2}
    assert REGISTRY.get_sample_value("composition_outbox_oldest_pending_age_seconds") == 0
    text = StringIO()
    call_command("outbox", "status", stdout=text)
    assert "oldest_pending_age_s: None" in text.getvalue()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nudge_only")  # rows stay pending for the command to relay
def test_relay_command_relays_everything_pending() -> None:
    for seq in range(7):
        publish(PROBE, {"seq": seq}, key="k")
    result = _outbox("relay", "--batch-size", "3")
    assert result["relayed"] == 7
    assert [m.kwargs["seq"] for m in enqueued(QUEUE)] == list(range(7))
    assert _outbox("status")["pending"] == 0
    with pytest.raises(CommandError):
        call_command("outbox", "relay", "--batch-size", "0")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nudge_only")
def test_an_option_the_action_does_not_take_is_refused_not_ignored() -> None:
    publish(PROBE, {"seq": 1})
    for args, says in ((("relay", "--dry-run"), "--dry-run is for prune only, not relay"),
                       (("status", "--older-than", "3"), "--older-than is for prune only, not status"),
                       (("prune", "--batch-size", "5"), "--batch-size is for relay only, not prune")):
        with pytest.raises(CommandError, match=says):
            call_command("outbox", *args, stdout=StringIO())
    assert _outbox("status")["pending"] == 1  # the refused relay sent nothing


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nudge_only")
def test_relay_command_with_the_broker_away_says_nothing_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the runbook sends an operator to run after an outage: a broker still away is an
    # answer, not a traceback, and the rows stay pending.
    publish(PROBE, {"seq": 1})
    server = ThrowawayRedis().start()
    away = RedisBroker(url=server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    server.close()  # gone, its data directory with it: a broker that is away
    monkeypatch.setattr("composition.management.commands.outbox.configured_broker", lambda: away)
    with pytest.raises(CommandError, match=r"the broker did not take the messages .*; 1 still pending, none lost"):
        call_command("outbox", "relay", stdout=StringIO())
    assert list(OutboxMessage.objects.values_list("status", "claimed_until")) == [("pending", None)]
    with pytest.raises(CommandError, match="--batch-size must be between 1 and"):
        call_command("outbox", "relay", "--batch-size", str(2**63))


@pytest.mark.django_db
def test_prune_deletes_only_old_sent_rows_in_batches() -> None:
    _sent(10, 7)
    _sent(2, 2)
    pending = publish(PROBE, {"seq": 1})
    OutboxMessage.objects.filter(pk=pending.pk).update(created_at=timezone.now() - timedelta(days=30))
    assert _outbox("prune", "--older-than", "5", "--dry-run") == {"would_delete": 7, "older_than_days": 5.0}
    assert OutboxMessage.objects.count() == 10
    assert prune_sent(5 * 86400, batch_size=3) == 7  # three batches: 3, 3, 1
    assert _outbox("prune", "--older-than", "1") == {"deleted": 2, "older_than_days": 1.0}
    assert list(OutboxMessage.objects.values_list("pk", flat=True)) == [pending.pk]


@pytest.mark.django_db
def test_a_delayed_message_is_kept_until_it_is_due_and_then_the_retention_has_passed() -> None:
    # Sent at publish (the broker holds the delay), due 10 days later: with 7 days' retention
    # its row stays until 7 days after it is due, where the task's result is read from it.
    sent_at = timezone.now() - timedelta(days=8)
    for due_in_days, created_days_ago in ((10, 8), (0.5, 8), (None, 8)):
        row = publish(PROBE, {"seq": 1}, delay_s=None if due_in_days is None else due_in_days * 86400)
        OutboxMessage.objects.filter(pk=row.pk).update(status="sent", sent_at=sent_at,
                                                       created_at=timezone.now() - timedelta(days=created_days_ago))
    assert prune_sent(7 * 86400) == 2
    [kept] = OutboxMessage.objects.all()
    assert kept.delay_s == 10 * 86400


@pytest.mark.django_db
def test_plain_output_is_readable() -> None:
    publish(PROBE, {"seq": 1})
    out = StringIO()
    call_command("outbox", "status", stdout=out)
    assert "pending: 1" in out.getvalue() and f"  {PROBE}: 1" in out.getvalue()


# -- admin -------------------------------------------------------------------------------------------------------
@pytest.fixture
def staff_client(db: None) -> Client:
    user = User.objects.create_user("operator", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_outboxmessage"))
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_admin_list_shows_pending_count_and_oldest_age_and_filters(staff_client: Client) -> None:
    old = publish(PROBE, {"seq": 1}, key="invoice:42")
    OutboxMessage.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(seconds=300))
    publish(PROBE, {"seq": 2}, key="invoice:7")
    _sent(1, 1)
    response = staff_client.get("/admin/composition/outboxmessage/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "<h2>Outbox: 2 pending · oldest pending 30" in body
    assert "<title>Outbox: 2 pending · oldest pending 30" in body  # the tab says what it counts
    filtered = staff_client.get("/admin/composition/outboxmessage/", {"status__exact": "sent"})
    assert filtered.context["cl"].result_count == 1
    by_actor = staff_client.get("/admin/composition/outboxmessage/", {"actor_name": PROBE})
    assert by_actor.context["cl"].result_count == 3
    by_key = staff_client.get("/admin/composition/outboxmessage/", {"q": "invoice:42"})
    assert [o.pk for o in by_key.context["cl"].result_list] == [old.pk]
    by_id = staff_client.get("/admin/composition/outboxmessage/", {"q": str(old.pk)})
    assert [o.pk for o in by_id.context["cl"].result_list] == [old.pk]


@pytest.mark.django_db
def test_admin_list_says_when_each_row_was_sent_or_where_it_stands(staff_client: Client) -> None:
    sent, leased, failed, waiting = (publish(PROBE, {"seq": seq}) for seq in range(4))
    now = timezone.now()
    OutboxMessage.objects.filter(pk=sent.pk).update(status="sent", sent_at=now, claimed_until=None)
    OutboxMessage.objects.filter(pk=leased.pk).update(claimed_until=now + timedelta(seconds=30))
    OutboxMessage.objects.filter(pk=failed.pk).update(claimed_until=None, last_error="ConnectionError: refused")
    OutboxMessage.objects.filter(pk=waiting.pk).update(claimed_until=now - timedelta(seconds=1))
    body = staff_client.get("/admin/composition/outboxmessage/").content.decode()
    delivery = {int(pk): cell for pk, cell in re.findall(
        r'outboxmessage/(\d+)/change/.*?<td class="field-delivery">(.*?)</td>', body, re.DOTALL)}
    assert set(delivery) == {sent.pk, leased.pk, failed.pk, waiting.pk}
    assert timezone.localtime(now).strftime("%Y-%m-%d %H:%M:%S") in delivery[sent.pk]
    assert "leased until" in delivery[leased.pk]
    assert "waiting, last error: ConnectionError: refused" in delivery[failed.pk]
    assert "waiting for the relay" in delivery[waiting.pk]


@pytest.mark.django_db
def test_admin_detail_is_read_only_with_a_pretty_payload(staff_client: Client) -> None:
    row = publish(PROBE, {"seq": 1, "note": "<b>hi</b>"}, key="k")
    response = staff_client.get(f"/admin/composition/outboxmessage/{row.pk}/change/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "<pre>{\n  &quot;note&quot;: &quot;&lt;b&gt;hi&lt;/b&gt;&quot;,\n  &quot;seq&quot;: 1\n}</pre>" in body
    assert row.message_id in body
    assert staff_client.get("/admin/composition/outboxmessage/add/").status_code == 403
    assert staff_client.post(f"/admin/composition/outboxmessage/{row.pk}/delete/").status_code == 403
    assert staff_client.post(f"/admin/composition/outboxmessage/{row.pk}/change/",
                             {"key": "changed"}).status_code == 403
    row.refresh_from_db()
    assert row.key == "k"
    due = timezone.now() + timedelta(hours=2)
    OutboxMessage.objects.filter(pk=row.pk).update(status="held", due_at=due)
    held = staff_client.get(f"/admin/composition/outboxmessage/{row.pk}/change/").content.decode()
    assert "field-due_at" in held and formats.date_format(timezone.localtime(due), "DATETIME_FORMAT") in held


# -- system checks ---------------------------------------------------------------------------------------------
def test_system_checks_report_bad_outbox_settings(settings: object) -> None:
    from composition.checks import check_outbox_settings

    settings.COMPOSITION = {"OUTBOX_BATCH_SIZE": 0, "OUTBOX_MAX_PAYLOAD_BYTES": 1.5,  # type: ignore[attr-defined]
                            "OUTBOX_LEASE_S": "30"}
    assert sorted(m.id for m in check_outbox_settings()) == ["composition.E020", "composition.E021",
                                                             "composition.E021"]
    settings.COMPOSITION = {"OUTBOX_LEASE_S": 1.0, "OUTBOX_SWEEP_INTERVAL_S": 2.0}  # type: ignore[attr-defined]
    assert [m.id for m in check_outbox_settings()] == ["composition.W020"]
    settings.COMPOSITION = {}  # type: ignore[attr-defined]
    assert check_outbox_settings() == []
