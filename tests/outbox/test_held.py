"""Long delays wait in the outbox (``OUTBOX_HELD_DELAY_S``): a held row is on no broker and in no
depth, a sweep relays it once due (the tests drive its clock by moving ``due_at``), and a held
row with a key does not hold its key back."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from composition.backpressure.depth import queue_depth
from composition.broker.configured import configured_broker
from composition.outbox import OutboxMessage, publish, publish_many
from composition.outbox.held import release_due
from composition.outbox.maintenance import outbox_status, pending_summary
from composition.outbox.relay import Relay
from tests.outboxapp.helpers import delayed, enqueued

PROBE = "outboxapp_relay_probe"
QUEUE = "outboxapp_probe"
TWO_HOURS_S = 7200.0

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("nudge_only"),
    pytest.mark.empty_queues(QUEUE),
]


def _come_due(*rows: OutboxMessage, ago_s: float = 1.0) -> None:
    """Move the rows' due time to ``ago_s`` seconds ago: the test's clock, two hours on."""
    OutboxMessage.objects.filter(pk__in=[row.pk for row in rows]).update(
        due_at=timezone.now() - timedelta(seconds=ago_s))


def test_a_two_hour_delay_is_held_in_the_outbox_on_no_broker_and_in_no_depth_until_due() -> None:
    with transaction.atomic():
        row = publish(PROBE, {"seq": 1}, delay_s=TWO_HOURS_S)
    row.refresh_from_db()
    assert row.status == OutboxMessage.Status.HELD
    assert row.due_at == row.created_at + timedelta(seconds=TWO_HOURS_S)
    relay = Relay(configured_broker())
    assert relay.run_until_idle() == 0
    assert (enqueued(QUEUE), delayed(QUEUE)) == ([], [])
    assert queue_depth(QUEUE) == 0
    assert pending_summary() == (0, 0.0)
    status = outbox_status()
    assert (status.pending, status.held) == (0, 1)
    assert status.next_due_in_s is not None and TWO_HOURS_S - 60 < status.next_due_in_s <= TWO_HOURS_S

    _come_due(row)
    assert relay.run_until_idle() == 1
    row.refresh_from_db()
    assert row.status == OutboxMessage.Status.SENT
    [message] = enqueued(QUEUE)  # on the queue itself, not its delay queue: no delay is left
    assert delayed(QUEUE) == [] and "eta" not in message.options
    assert message.kwargs == {"seq": 1}
    assert relay.run_until_idle() == 0 and len(enqueued(QUEUE)) == 1


def test_a_delay_up_to_the_bound_waits_on_the_broker_as_before() -> None:
    with override_settings(COMPOSITION={**settings.COMPOSITION, "OUTBOX_HELD_DELAY_S": 60}):
        at_bound = publish(PROBE, {"seq": 1}, delay_s=60)
        over = publish(PROBE, {"seq": 2}, delay_s=61)
    assert OutboxMessage.objects.get(pk=at_bound.pk).status == OutboxMessage.Status.PENDING
    assert OutboxMessage.objects.get(pk=over.pk).status == OutboxMessage.Status.HELD
    Relay(configured_broker()).run_until_idle()
    assert [message.kwargs for message in delayed(QUEUE)] == [{"seq": 1}]


def test_publish_many_holds_every_row_and_a_release_counts_the_wait_from_the_due_time() -> None:
    with transaction.atomic():
        rows = publish_many(PROBE, [{"seq": seq} for seq in range(5)], delay_s=TWO_HOURS_S)
    assert set(OutboxMessage.objects.filter(pk__in=[r.pk for r in rows]).values_list("status", flat=True)) == {"held"}
    _come_due(*rows[:3], ago_s=5)
    assert release_due() == 3
    assert release_due() == 0
    # Published two hours before (by the test's clock), due 5 s ago: it has waited 5 s.
    OutboxMessage.objects.filter(pk__in=[r.pk for r in rows]).update(
        created_at=timezone.now() - timedelta(seconds=TWO_HOURS_S))
    pending, oldest_s = pending_summary()
    assert pending == 3 and 4 <= oldest_s < 60, oldest_s
    assert outbox_status().held == 2


def test_a_held_row_with_a_key_does_not_hold_the_key_back_and_goes_first_once_due() -> None:
    with transaction.atomic():
        held = publish(PROBE, {"seq": 0}, key="k", delay_s=TWO_HOURS_S)
        publish(PROBE, {"seq": 1}, key="k")
    relay = Relay(configured_broker())
    assert relay.run_until_idle() == 1
    assert [message.kwargs["seq"] for message in enqueued(QUEUE)] == [1]
    with transaction.atomic():
        later = publish(PROBE, {"seq": 2}, key="k")
    # Due before the relay comes round: it goes before the key's row still pending.
    _come_due(held)
    assert relay.run_until_idle() == 2
    assert [message.kwargs["seq"] for message in enqueued(QUEUE)] == [1, 0, 2]
    assert OutboxMessage.objects.get(pk=later.pk).status == OutboxMessage.Status.SENT


def test_check_warns_of_a_job_whose_retries_wait_longer_than_the_bound(settings: Any) -> None:
    settings.COMPOSITION = {**settings.COMPOSITION, "OUTBOX_HELD_DELAY_S": 1.0}
    warned = {message.msg.split("'")[1] for message in run_checks() if message.id == "composition.W022"}
    assert "rabbit_effect" not in warned  # max_delay_s 0.2
    assert "crash_effect" not in warned
    assert "quorum_effect" not in warned
    settings.COMPOSITION = {**settings.COMPOSITION, "OUTBOX_HELD_DELAY_S": 0.1}
    warned = {message.msg.split("'")[1] for message in run_checks() if message.id == "composition.W022"}
    assert {"rabbit_effect", "crash_effect"} <= warned


@pytest.mark.rabbitmq
def test_on_rabbitmq_a_held_row_is_relayed_once_due_to_its_queue_not_the_delay_queue() -> None:
    import pika

    from composition.testing import use_broker
    from tests.helpers import RABBITMQ_URL, delete_rabbitmq_queue

    delete_rabbitmq_queue(QUEUE)
    row = publish(PROBE, {"seq": 1}, delay_s=TWO_HOURS_S)  # declared on the configured broker
    try:
        with use_broker(RABBITMQ_URL) as broker:
            relay = Relay(broker)
            assert relay.run_until_idle() == 0
            assert queue_depth(QUEUE) == 0
            _come_due(row)
            assert relay.run_until_idle() == 1
            assert queue_depth(QUEUE) == 1
        connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
        try:
            channel = connection.channel()
            counts = [channel.queue_declare(name, passive=True).method.message_count
                      for name in (QUEUE, f"{QUEUE}.DQ")]
        finally:
            connection.close()
        assert counts == [1, 0]
    finally:
        delete_rabbitmq_queue(QUEUE)


@pytest.mark.slow
@pytest.mark.empty_queues("jobs_crash", "composition.outbox")
def test_runworkers_sweeps_a_held_job_to_its_queue_once_due_and_it_runs_once(worker_processes: Any) -> None:
    import time

    from composition.testing import wait_until
    from tests.jobsapp.models import Effect

    worker = worker_processes.spawn(["--threads", "2", "--queues", "jobs_crash,composition.outbox"])
    with transaction.atomic():
        row = publish("crash_effect", {"key": "held-1"}, delay_s=TWO_HOURS_S)
    # Started (its last component is the heartbeat), then a few sweeps: none may take it.
    wait_until(lambda: '"component": "heartbeat"' in worker.output(), 60, message=worker.output()[-3000:])
    time.sleep(2)
    assert not Effect.objects.filter(key="held-1").exists()
    assert OutboxMessage.objects.get(pk=row.pk).status == OutboxMessage.Status.HELD
    _come_due(row)
    wait_until(lambda: Effect.objects.filter(key="held-1").exists(), 30,
               message="the due job did not run:\n" + worker.output()[-3000:])
    assert worker.terminate() == 0
    assert Effect.objects.filter(key="held-1").count() == 1


def test_a_due_held_row_is_released_only_once_no_row_of_its_key_is_in_flight() -> None:
    from composition.outbox.claims import claim, mark_sent

    with transaction.atomic():
        held = publish(PROBE, {"seq": 0}, key="k", delay_s=TWO_HOURS_S)
        later = publish(PROBE, {"seq": 1}, key="k")
        unkeyed = publish(PROBE, {"seq": 2}, delay_s=TWO_HOURS_S)
    [in_flight] = claim(limit=10, lease_s=30, relay_id="relay-a")
    assert in_flight.id == later.pk
    _come_due(held, unkeyed)
    # Released now, it would be its key's head beside the row in flight: two of a key at once.
    assert release_due() == 1
    assert [message.id for message in claim(limit=10, lease_s=30, relay_id="relay-b")] == [unkeyed.pk]
    mark_sent([in_flight.id], sent_at=timezone.now(), relay_id="relay-a")
    assert release_due() == 1
    assert [message.id for message in claim(limit=10, lease_s=30, relay_id="relay-b")] == [held.pk]


def test_a_due_held_row_waits_while_a_relay_is_still_claiming_a_row_of_its_key() -> None:
    import psycopg

    from composition.outbox.claim_sql import CLAIM_SQL, KEEP
    from composition.outbox.claims import claim
    from composition.testing import current_database_url

    with transaction.atomic():
        held = publish(PROBE, {"seq": 0}, key="k", delay_s=TWO_HOURS_S)
        later = publish(PROBE, {"seq": 1}, key="k")
    OutboxMessage.objects.filter(pk=later.pk).update(claimed_until=None, claimed_by="")
    _come_due(held)
    table = connection.ops.quote_name(OutboxMessage._meta.db_table)
    # Relay A's claim has leased the key's head but not committed: its lease is not visible yet.
    with psycopg.connect(current_database_url()) as relay_a:
        claimed = relay_a.execute(CLAIM_SQL.format(table=table, relax=KEEP),
                                  {"limit": 10, "lease_s": 30, "relay_id": "relay-a", "only_ids": None}).fetchall()
        assert [row[0] for row in claimed] == [later.pk]
        # Released now, the held row would be the key's head beside the row A sends.
        assert release_due() == 0
        relay_a.commit()
    # A's commit left its lease visible: the release still waits, and no relay takes the held row.
    assert release_due() == 0
    assert claim(limit=10, lease_s=30, relay_id="relay-b") == []
    assert OutboxMessage.objects.get(pk=held.pk).status == OutboxMessage.Status.HELD
