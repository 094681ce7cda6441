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
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from composition.jobs.broker_losses import EPOCH_KEY, check_counts, check_epoch, reconcile
from composition.jobs.models import BrokerEpoch, DeadLetter, ProcessedMessage
from composition.outbox.models import OutboxMessage, message_id_for
from composition.testing import metric_value
from tests.helpers import sent_row

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


def test_a_kept_token_is_checked_without_a_transaction_or_the_lock(throwaway_redis_server: Any) -> None:
    """Every worker process checks each tick: with the token there, one SELECT and one GET, and
    no advisory lock held across the Redis call."""
    client = redis.Redis.from_url(throwaway_redis_server.url)
    assert check_epoch(client) is None  # the first epoch, begun under the lock
    with CaptureQueriesContext(connection) as queries:
        assert check_epoch(client) is None
    statements = [query["sql"] for query in queries.captured_queries]
    assert len(statements) == 1 and statements[0].startswith("SELECT"), statements
    assert not any("pg_advisory" in sql for sql in statements)


def test_a_loss_sends_again_only_what_never_ran_and_each_row_once(settings: Any) -> None:
    settings.COMPOSITION = {**settings.COMPOSITION, "BROKER_LOSS_LOOKBACK_S": 3600}
    windows = {"crash_effect": 10.0, "quorum_effect": 10.0}
    lost = sent_row("crash_effect", sent_s_ago=60)
    ran = sent_row("crash_effect", sent_s_ago=60)
    ProcessedMessage.objects.create(message_id=message_id_for(ran.pk), actor="crash_effect")
    failed = sent_row("crash_effect", sent_s_ago=60)
    DeadLetter.objects.create(actor="crash_effect", queue="jobs_crash", message_id=message_id_for(failed.pk),
                              attempts=1, error_class="E", fingerprint="f", first_failed_at=timezone.now(),
                              last_failed_at=timezone.now())
    in_its_window = sent_row("crash_effect", sent_s_ago=5)  # a retry may still be waiting out its backoff
    delayed = sent_row("crash_effect", sent_s_ago=60, delay_s=120)  # due in a minute: its window is ahead
    paused = sent_row("quorum_effect", sent_s_ago=60, queue="jobs_quorum")
    too_old = sent_row("crash_effect", sent_s_ago=7200)  # before the look-back
    plain = sent_row("crash_effect_plain", sent_s_ago=60)  # not idempotent: not in the windows
    epoch = BrokerEpoch.objects.create(token="t", lost=True)
    after = sent_row("crash_effect", sent_s_ago=0)  # sent after the loss: on the new broker
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


def test_a_wipe_seen_first_by_the_counts_is_a_loss_of_every_queue(throwaway_redis_server: Any, settings: Any) -> None:
    settings.COMPOSITION = {**settings.COMPOSITION, "BROKER_LOSS_LOOKBACK_S": 3600}
    client = redis.Redis.from_url(throwaway_redis_server.url)
    assert check_epoch(client) is None
    sent_row("crash_effect", sent_s_ago=60)
    throwaway_redis_server.restart()  # nothing persisted: the token went with the messages
    epoch = check_counts(client, "dramatiq", {"jobs_crash": {"crash_effect"}})
    assert epoch is not None and (epoch.queue, epoch.cause) == ("", "its epoch token was gone")
    assert check_epoch(client) is None  # the same loss, recorded once
    client.close()
