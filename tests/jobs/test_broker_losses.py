"""A loss of the Redis broker's data, reconciled from the inbox ledger (composition.jobs.broker_losses):
the epoch token that tells a loss, the counts that tell one the token survives, and which sent
rows a loss sends again: only idempotent jobs' rows sent before it, within the look-back, past
their redelivery window, never run (no ledger row) nor failed (no dead letter), in a queue not
paused; each once per loss."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import redis
from django.utils import timezone

from composition.broker.keys import messages_key
from composition.jobs.broker_losses import (
    COUNT_CHECK_KEY,
    COUNT_CHECK_MARGIN_S,
    EPOCH_KEY,
    Shortfall,
    check_counts,
    check_epoch,
    reconcile,
    short_queue,
)
from composition.jobs.models import BrokerEpoch, DeadLetter, ProcessedMessage
from composition.outbox.models import OutboxMessage, message_id_for
from composition.testing import metric_value

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_epoch_token_tells_a_loss_once_and_a_first_check_is_none(throwaway_redis_server: Any) -> None:
    client = redis.Redis.from_url(throwaway_redis_server.url)
    assert check_epoch(client) is None  # the first epoch: nothing was there to lose
    assert check_epoch(client) is None
    [first] = BrokerEpoch.objects.all()
    assert client.get(EPOCH_KEY).decode() == first.token and not first.lost
    throwaway_redis_server.restart()  # nothing persisted: the broker comes back empty
    lost = check_epoch(client)
    assert lost is not None and lost.lost
    assert check_epoch(client) is None  # one loss, recorded once
    assert BrokerEpoch.objects.filter(lost=True).count() == 1


def _sent(actor: str, *, sent_s_ago: float, queue: str = "jobs_crash", delay_s: float | None = None) -> OutboxMessage:
    sent_at = timezone.now() - timedelta(seconds=sent_s_ago)
    return OutboxMessage.objects.create(actor_name=actor, queue_name=queue, payload={}, status="sent",
                                        created_at=sent_at, sent_at=sent_at, delay_s=delay_s)


def test_a_loss_sends_again_only_what_never_ran_and_each_row_once(settings: Any) -> None:
    settings.COMPOSITION = {**settings.COMPOSITION, "BROKER_LOSS_LOOKBACK_S": 3600}
    windows = {"crash_effect": 10.0, "quorum_effect": 10.0}
    lost = _sent("crash_effect", sent_s_ago=60)
    ran = _sent("crash_effect", sent_s_ago=60)
    ProcessedMessage.objects.create(message_id=message_id_for(ran.pk), actor="crash_effect")
    failed = _sent("crash_effect", sent_s_ago=60)
    DeadLetter.objects.create(actor="crash_effect", queue="jobs_crash", message_id=message_id_for(failed.pk),
                              attempts=1, error_class="E", fingerprint="f", first_failed_at=timezone.now(),
                              last_failed_at=timezone.now())
    in_its_window = _sent("crash_effect", sent_s_ago=5)  # a retry may still be waiting out its backoff
    delayed = _sent("crash_effect", sent_s_ago=60, delay_s=120)  # due in a minute: its window is ahead
    paused = _sent("quorum_effect", sent_s_ago=60, queue="jobs_quorum")
    too_old = _sent("crash_effect", sent_s_ago=7200)  # before the look-back
    plain = _sent("crash_effect_plain", sent_s_ago=60)  # not idempotent: not in the windows
    epoch = BrokerEpoch.objects.create(token="t", lost=True)
    after = _sent("crash_effect", sent_s_ago=0)  # sent after the loss: on the new broker
    after.sent_at = epoch.began_at + timedelta(seconds=1)
    after.save()
    before = metric_value("composition_outbox_resent_total", actor="crash_effect")

    looked_at, resent = reconcile(epoch, windows, paused=["jobs_quorum"])
    assert (looked_at, resent) == (3, 1)  # lost, ran, failed
    row = OutboxMessage.objects.get(pk=lost.pk)
    assert (row.status, row.sent_at, row.reconciled_after_loss) == ("pending", None, epoch.pk)
    assert "broker lost its data" in row.last_error
    for other in (ran, failed, in_its_window, delayed, paused, too_old, plain, after):
        assert OutboxMessage.objects.get(pk=other.pk).status == "sent", other
    assert BrokerEpoch.objects.get(pk=epoch.pk).resent == 1
    assert metric_value("composition_outbox_resent_total", actor="crash_effect") == before + 1

    # Sent again and on the broker once more: a second round leaves it, once per loss.
    OutboxMessage.objects.filter(pk=lost.pk).update(status="sent", sent_at=timezone.now() - timedelta(seconds=60))
    assert reconcile(epoch, windows, paused=["jobs_quorum"]) == (0, 0)
    # Resumed, the paused queue's row is looked at too.
    assert reconcile(epoch, windows) == (1, 1)


def test_a_queue_holding_fewer_messages_than_its_unfinished_sent_rows_begins_one_lost_epoch(
        throwaway_redis_server: Any, settings: Any) -> None:
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.message import Message

    settings.COMPOSITION = {**settings.COMPOSITION, "BROKER_LOSS_LOOKBACK_S": 3600}
    broker = RedisBroker(url=throwaway_redis_server.url)
    client, queues = broker.client, {"jobs_crash": {"crash_effect"}}
    assert check_counts(client, broker.namespace, queues) is None  # no epoch yet: nothing to compare with
    assert check_epoch(client) is None  # the first epoch
    rows = [_sent("crash_effect", sent_s_ago=60) for _ in range(5)]
    ProcessedMessage.objects.create(message_id=message_id_for(rows[0].pk), actor="crash_effect")
    DeadLetter.objects.create(actor="crash_effect", queue="jobs_crash", message_id=message_id_for(rows[1].pk),
                              attempts=1, error_class="E", fingerprint="f", first_failed_at=timezone.now(),
                              last_failed_at=timezone.now())
    _sent("crash_effect", sent_s_ago=COUNT_CHECK_MARGIN_S / 2)  # may not be on the broker yet: not counted
    _sent("crash_effect_plain", sent_s_ago=60)  # not idempotent: never counted
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
    other = _sent("quorum_effect", sent_s_ago=60, queue="jobs_quorum")
    assert reconcile(epoch, {"crash_effect": 10.0, "quorum_effect": 10.0}) == (5, 3)
    assert OutboxMessage.objects.get(pk=other.pk).status == "sent"
    broker.close()


def test_a_wipe_seen_first_by_the_counts_is_a_loss_of_every_queue(throwaway_redis_server: Any, settings: Any) -> None:
    settings.COMPOSITION = {**settings.COMPOSITION, "BROKER_LOSS_LOOKBACK_S": 3600}
    client = redis.Redis.from_url(throwaway_redis_server.url)
    assert check_epoch(client) is None
    _sent("crash_effect", sent_s_ago=60)
    throwaway_redis_server.restart()  # nothing persisted: the token went with the messages
    epoch = check_counts(client, "dramatiq", {"jobs_crash": {"crash_effect"}})
    assert epoch is not None and (epoch.queue, epoch.cause) == ("", "its epoch token was gone")
    assert check_epoch(client) is None  # the same loss, recorded once
    client.close()
