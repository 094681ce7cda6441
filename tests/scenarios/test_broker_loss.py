"""A Redis broker that loses its data (restarted without persistence) while a third of the jobs
wait on it: once their redelivery window has passed, ``runworkers`` sends those jobs again from
the outbox, and every job's effect is committed exactly once; a job waiting out a retry's backoff
and a paused queue's jobs are not sent again (composition.jobs.broker_losses). 300 jobs in the
gate, 5,000 under ``make soak``. And a queue's messages lost while the epoch token stays: the
counts tell it, and those jobs run once each."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.db import transaction
from django.db.models import Count

from composition.jobs.models import BrokerEpoch, DeadLetter, ProcessedMessage
from composition.outbox import OutboxMessage, publish, publish_many
from composition.queues.control import pause_queue, resume_queue
from composition.testing import wait_until
from tests.jobsapp import jobs
from tests.jobsapp.models import Effect

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("nudge_only")]


def _publish(actor: str, keys: list[str]) -> None:
    for start in range(0, len(keys), 500):
        with transaction.atomic():
            publish_many(actor, [{"key": key} for key in keys[start:start + 500]])


@pytest.mark.parametrize("total", [pytest.param(300, id="gate"),
                                   pytest.param(5_000, id="soak", marks=pytest.mark.soak)])
def test_jobs_lost_with_the_broker_s_data_run_once_each_after_their_window_and_no_others_are_sent_again(
        throwaway_redis_server: Any, worker_processes: Any, total: int) -> None:
    worker = worker_processes.spawn(
        ["--threads", "4", "--queues", f"{jobs.LOSS_QUEUE},{jobs.LOSS_PAUSED_QUEUE},composition.outbox"],
        BROKER_URL=throwaway_redis_server.url,
        COMPOSITION_TEST_OVERRIDES=json.dumps({"BROKER_LOSS_CHECK_INTERVAL_S": 0.5, "QUEUE_PAUSE_REFRESH_S": 0.2}))

    def log() -> str:
        return worker.output()[-3000:]

    ran_keys = [f"ran-{index}" for index in range(total - total // 3)]
    lost_keys = [f"lost-{index}" for index in range(total // 3)]
    _publish("loss_effect", ran_keys)
    publish("loss_retried", {"key": "retried"})
    wait_until(lambda: Effect.objects.filter(key__startswith="ran-").count() == len(ran_keys), 120,
               message=f"the first jobs did not run:\n{log()}")
    # Its first run failed (its attempt row rolled back with it): a retry waits a minute on the broker.
    wait_until(lambda: "Retrying message" in worker.output(), 30, message=log())
    # A third waits on the broker, in a paused queue, when its data goes; and a queue that stays paused.
    pause_queue(jobs.LOSS_QUEUE, by="test")
    pause_queue(jobs.LOSS_PAUSED_QUEUE, by="test")
    time.sleep(1)
    _publish("loss_effect", lost_keys)
    publish("loss_effect_paused", {"key": "paused"})
    wait_until(lambda: not OutboxMessage.objects.filter(status="pending").exists(), 60,
               message=f"not relayed:\n{log()}")
    assert BrokerEpoch.objects.filter(lost=False).count() == 1

    throwaway_redis_server.restart()  # nothing persisted: every message on it is gone
    wait_until(lambda: BrokerEpoch.objects.filter(lost=True).exists(), 30, message=f"no loss detected:\n{log()}")
    resume_queue(jobs.LOSS_QUEUE, by="test")
    wait_until(lambda: Effect.objects.filter(key__startswith="lost-").values("key").distinct().count()
               == len(lost_keys), 120, interval_s=0.5, message=f"the lost jobs did not run again:\n{log()}")
    assert worker.terminate() == 0, log()

    doubled = list(Effect.objects.values("key").annotate(n=Count("id")).filter(n__gt=1))
    assert doubled == [], "an effect committed twice"
    assert ProcessedMessage.objects.filter(actor="loss_effect").count() == len(ran_keys) + len(lost_keys)
    assert not DeadLetter.objects.exists()
    epoch = BrokerEpoch.objects.get(lost=True)
    assert epoch.resent == len(lost_keys), "only the lost jobs are sent again"
    # Within its window (a retry waiting out a minute's backoff) and in a paused queue: not sent again.
    for actor in ("loss_retried", "loss_effect_paused"):
        row = OutboxMessage.objects.get(actor_name=actor)
        assert (row.status, row.reconciled_after_loss) == ("sent", None), actor
    assert "outbox rows sent again after a loss of the broker's data" in worker.output()


def test_a_queue_s_messages_lost_with_the_epoch_token_kept_are_found_by_the_counts_and_run_once_each(
        throwaway_redis_server: Any, worker_processes: Any) -> None:
    import redis

    from composition.broker.keys import messages_key, queue_key
    from tests.settings import the_gate_s_own

    worker = worker_processes.spawn(
        ["--threads", "4", "--queues", f"{jobs.LOSS_QUEUE},composition.outbox"],
        BROKER_URL=throwaway_redis_server.url,
        COMPOSITION_TEST_OVERRIDES=json.dumps({"BROKER_LOSS_CHECK_INTERVAL_S": 0.5, "QUEUE_PAUSE_REFRESH_S": 0.2}))

    def log() -> str:
        return worker.output()[-3000:]

    _publish("loss_effect", [f"ran-{index}" for index in range(100)])
    wait_until(lambda: Effect.objects.filter(key__startswith="ran-").count() == 100, 60,
               message=f"the first jobs did not run:\n{log()}")
    # A hundred wait on the broker in a paused queue, counted again and again: no loss.
    pause_queue(jobs.LOSS_QUEUE, by="test")
    time.sleep(1)
    lost_keys = [f"lost-{index}" for index in range(100)]
    _publish("loss_effect", lost_keys)
    wait_until(lambda: not OutboxMessage.objects.filter(status="pending").exists(), 60,
               message=f"not relayed:\n{log()}")
    time.sleep(7)  # past the count's margin, a dozen checks
    assert not BrokerEpoch.objects.filter(lost=True).exists(), log()

    # The queue's messages go (evicted under maxmemory, say); the epoch token stays.
    client = redis.Redis.from_url(the_gate_s_own(throwaway_redis_server.url))  # the workers' database on it
    assert client.delete(queue_key("dramatiq", jobs.LOSS_QUEUE), messages_key("dramatiq", jobs.LOSS_QUEUE)) == 2
    client.close()
    wait_until(lambda: BrokerEpoch.objects.filter(lost=True).exists(), 30, message=f"no loss detected:\n{log()}")
    resume_queue(jobs.LOSS_QUEUE, by="test")
    wait_until(lambda: Effect.objects.filter(key__startswith="lost-").values("key").distinct().count() == 100,
               120, interval_s=0.5, message=f"the lost jobs did not run again:\n{log()}")
    assert worker.terminate() == 0, log()

    doubled = list(Effect.objects.values("key").annotate(n=Count("id")).filter(n__gt=1))
    assert doubled == [], "an effect committed twice"
    epoch = BrokerEpoch.objects.get(lost=True)
    assert (epoch.queue, epoch.cause, epoch.resent) == (
        jobs.LOSS_QUEUE, f"queue {jobs.LOSS_QUEUE}: 0 messages on the broker for 100 sent, unfinished jobs", 100)
    assert BrokerEpoch.objects.filter(lost=True).count() == 1, "one loss, recorded once"
