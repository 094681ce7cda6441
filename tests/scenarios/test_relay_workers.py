"""End to end with a real ``runworkers`` process: nudge, relay actor, sweeper, Dramatiq worker."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import transaction

from composition.outbox import OutboxMessage, publish
from composition.testing import wait_until
from tests.outboxapp import jobs
from tests.outboxapp.models import Effect, Order

pytestmark = [pytest.mark.empty_queues()]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_runworkers_relays_committed_messages_once_and_sweeps_lost_nudges(worker_processes: Any) -> None:
    worker = worker_processes.spawn(["--threads", "2", "--shutdown-timeout", "10"])

    # Atomicity: the rolled-back block leaves nothing behind; the committed one is run once.
    with pytest.raises(RuntimeError), transaction.atomic():
        order = Order.objects.create(reference="rolled back")
        publish(jobs.record_effect, {"seq": 1, "order_id": order.pk})
        raise RuntimeError("business failure")
    with transaction.atomic():
        order = Order.objects.create(reference="committed")
        row = publish(jobs.record_effect, {"seq": 2, "order_id": order.pk})
    wait_until(lambda: Effect.objects.filter(seq=2).exists(), 60, 0.1,
               message="committed message never ran:\n" + worker.output())

    # A crash between commit and nudge: the row exists but nobody was told. The sweep finds it.
    lost = OutboxMessage.objects.create(actor_name=jobs.record_effect.actor_name, queue_name=jobs.QUEUE,
                                        payload={"seq": 3})
    wait_until(lambda: Effect.objects.filter(seq=3).exists(), 30, 0.1,
               message="sweeper never relayed the un-nudged row:\n" + worker.output())

    # Leave time for a duplicate to show up (a sweep or a second nudge) before counting.
    time.sleep(2.5)
    assert sorted(Effect.objects.values_list("seq", "order_id")) == [(2, order.pk), (3, None)]
    assert Order.objects.filter(reference="rolled back").count() == 0
    assert OutboxMessage.objects.count() == 2
    for message in (row, lost):
        message.refresh_from_db()
        assert (message.status, message.attempts) == ("sent", 1)
    assert worker.terminate(30) == 0, worker.output()
