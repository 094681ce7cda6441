"""A queue short of messages (composition.jobs.shortfalls): the broker's ready, delayed and taken
messages against the newest sent idempotent rows that never ran, and the lost epoch of that queue
alone which the reconciler then begins (composition.jobs.broker_losses.check_counts)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from composition.broker.keys import messages_key
from composition.jobs.broker_losses import COUNT_CHECK_KEY, EPOCH_KEY, check_counts, check_epoch, reconcile
from composition.jobs.models import DeadLetter, ProcessedMessage
from composition.jobs.shortfalls import COUNT_CHECK_MARGIN_S, Shortfall, short_queue
from composition.outbox.models import OutboxMessage, message_id_for
from composition.testing import metric_value
from tests.helpers import sent_row

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_queue_holding_fewer_messages_than_its_unfinished_sent_rows_begins_one_lost_epoch(
        throwaway_redis_server: Any, settings: Any) -> None:
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.message import Message

    settings.COMPOSITION = {**settings.COMPOSITION, "BROKER_LOSS_LOOKBACK_S": 3600}
    broker = RedisBroker(url=throwaway_redis_server.url)
    client, queues = broker.client, {"jobs_crash": {"crash_effect"}}
    assert check_counts(client, broker.namespace, queues) is None  # no epoch yet: nothing to compare with
    assert check_epoch(client) is None  # the first epoch
    rows = [sent_row("crash_effect", sent_s_ago=60) for _ in range(5)]
    ProcessedMessage.objects.create(message_id=message_id_for(rows[0].pk), actor="crash_effect")
    DeadLetter.objects.create(actor="crash_effect", queue="jobs_crash", message_id=message_id_for(rows[1].pk),
                              attempts=1, error_class="E", fingerprint="f", first_failed_at=timezone.now(),
                              last_failed_at=timezone.now())
    sent_row("crash_effect", sent_s_ago=COUNT_CHECK_MARGIN_S / 2)  # may not be on the broker yet: not counted
    sent_row("crash_effect_plain", sent_s_ago=60)  # not idempotent: never counted
    # Three sent rows never ran: one message ready, one delayed (a retry's backoff), one taken.
    for delay in (None, 60_000, None):
        broker.enqueue(Message(queue_name="jobs_crash", actor_name="crash_effect", args=(), kwargs={}, options={}),
                       delay=delay)
    broker.consume("jobs_crash", prefetch=1, timeout=100).__next__()  # taken, not acked
    assert short_queue(client, broker.namespace, queues) is None
    assert check_counts(client, broker.namespace, queues) is None

    # One message goes (evicted, or a replica that had not received it took over): the token stays.
    lost_id = client.hkeys(messages_key(broker.namespace, "jobs_crash.DQ"))[0]
    client.hdel(messages_key(broker.namespace, "jobs_crash.DQ"), lost_id)
    assert check_epoch(client) is None
    assert short_queue(client, broker.namespace, queues) == Shortfall("jobs_crash", 2, 3)
    # Once per interval across the cluster: another process counted a moment ago.
    client.set(COUNT_CHECK_KEY, "1", px=60_000)
    assert check_counts(client, broker.namespace, queues, once_per_s=5.0) is None
    client.delete(COUNT_CHECK_KEY)
    before = metric_value("composition_broker_losses_total")
    epoch = check_counts(client, broker.namespace, queues, once_per_s=5.0)
    assert epoch is not None and epoch.lost and (epoch.queue, epoch.cause) == (
        "jobs_crash", "queue jobs_crash: 2 messages on the broker for 3 sent, unfinished jobs")
    assert client.get(EPOCH_KEY).decode() == epoch.token
    assert 0 < client.pttl(COUNT_CHECK_KEY) <= 5_000
    assert metric_value("composition_broker_losses_total") == before + 1
    assert check_counts(client, broker.namespace, queues) is None  # open: one loss, recorded once
    # The loss sends again what of that queue never ran: the three rows (the two still on the
    # broker too: the ledger makes the second run a no-op); another queue's row is left alone.
    other = sent_row("quorum_effect", sent_s_ago=60, queue="jobs_quorum")
    assert reconcile(epoch, {"crash_effect": 10.0, "quorum_effect": 10.0}) == (5, 3)
    assert OutboxMessage.objects.get(pk=other.pk).status == "sent"
    broker.close()


@pytest.mark.empty_queues("jobs_crash")  # the replay's own send, to the test broker
def test_a_replay_that_ran_is_not_counted_unfinished(throwaway_redis_server: Any, settings: Any) -> None:
    """A replayed dead letter's row ran under its original message's ledger key: an empty queue
    is not short of it, and a loss would not send it again."""
    from dramatiq.brokers.redis import RedisBroker

    from composition.jobs.replay import replay

    settings.COMPOSITION = {**settings.COMPOSITION, "BROKER_LOSS_LOOKBACK_S": 3600}
    broker = RedisBroker(url=throwaway_redis_server.url)
    client, queues = broker.client, {"jobs_crash": {"crash_effect"}}
    assert check_epoch(client) is None  # the first epoch
    now = timezone.now()
    letter = DeadLetter.objects.create(actor="crash_effect", queue="jobs_crash", message_id="the-original",
                                       payload={"key": "k"}, attempts=1, error_class="E", fingerprint="f",
                                       first_failed_at=now, last_failed_at=now)
    row = OutboxMessage.objects.get(pk=replay(letter.pk).replay_outbox_id)
    sent_at = now - timedelta(seconds=60)
    OutboxMessage.objects.filter(pk=row.pk).update(status="sent", created_at=sent_at, sent_at=sent_at)
    ProcessedMessage.objects.create(message_id="the-original", actor="crash_effect")  # as the worker runs it
    assert short_queue(client, broker.namespace, queues) is None
    assert check_counts(client, broker.namespace, queues) is None
    broker.close()
