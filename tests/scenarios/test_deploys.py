"""Deploys with real ``runworkers`` hosts on old and new code side by side (``JOBSAPP_CODE``,
tests/jobsapp/deploys.py): what the running code cannot run waits for its deploy window, then is
parked in one "incompatible" dead-letter group; nothing is lost, nothing runs with wrong
arguments, and a replay after the fix runs each message once.

Gate: all three (windows of a few seconds); the soak has no longer version of them."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pika
import pytest
from django.db import transaction
from dramatiq.common import xq_name

from composition.jobs.models import DeadLetter, ProcessedMessage
from composition.outbox import OutboxMessage, publish
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.testing import subprocess_env, wait_until
from tests.helpers import RABBITMQ_URL, ROOT
from tests.jobsapp.deploys import DEPLOY_QUEUE
from tests.jobsapp.models import Effect

pytestmark = [pytest.mark.slow, pytest.mark.empty_queues(DEPLOY_QUEUE, RELAY_QUEUE_NAME)]

COUNT = 30
HOST_ARGS = ["--threads", "4", "--queues", f"{DEPLOY_QUEUE},{RELAY_QUEUE_NAME}"]
INCOMPATIBLE = "composition.errors.IncompatibleMessageError"
WAITS = "the running code cannot run this message; it waits for the deploy"


def _code(code: str, window_s: float, **env: str) -> dict[str, str]:
    return {"JOBSAPP_CODE": code, "COMPOSITION_TEST_OVERRIDES": json.dumps({"DEPLOY_WINDOW_S": window_s}), **env}


def _manage(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), *argv], cwd=ROOT, capture_output=True, text=True,
                          env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.settings", **env), timeout=120)


def _effects(prefix: str) -> list[str]:
    return list(Effect.objects.filter(key__startswith=prefix).values_list("key", flat=True))


def test_a_breaking_change_deployed_anyway_parks_every_old_message_and_the_fix_replays_each_once(
        worker_processes) -> None:  # type: ignore[no-untyped-def]
    window_s = 3.0
    # Published by the old code: deploy_charge(invoice_id), sent to the broker after COMMIT.
    with transaction.atomic():
        for invoice_id in range(COUNT):
            publish("deploy_charge", {"invoice_id": invoice_id})
    # The new code requires a currency: every old message is refused, first at refused_at.
    host = worker_processes.spawn(HOST_ARGS, **_code("new", window_s))
    wait_until(lambda: WAITS in host.output(), 30, message="the new host refused an old message")
    refused_at = time.monotonic()
    time.sleep(window_s / 2)
    assert not DeadLetter.objects.filter(actor="deploy_charge").exists(), "parked within its window"
    assert _effects("charge-") == []
    wait_until(lambda: DeadLetter.objects.filter(actor="deploy_charge").count() == COUNT, 30,
               message="every old message parked once its window passed")
    assert time.monotonic() - refused_at >= window_s - 0.5
    letters = DeadLetter.objects.filter(actor="deploy_charge")
    assert set(letters.values_list("error_class", flat=True)) == {INCOMPATIBLE}
    assert letters.values("fingerprint").distinct().count() == 1, "one group"
    assert "missing a required argument 'currency'" in letters.first().error_message  # type: ignore[union-attr]
    assert letters.first().error_message.startswith("incompatible with the running code: ")  # type: ignore[union-attr]
    assert _effects("charge-") == [], "nothing ran with wrong arguments"
    host.terminate()

    # The fix: version 2, whose upgrade gives version-1 messages a currency. Replayed by its code.
    worker_processes.spawn(HOST_ARGS, **_code("fixed", window_s))
    fingerprint = letters.first().fingerprint  # type: ignore[union-attr]
    done = _manage("deadletters", "replay", "--fingerprint", fingerprint, "--yes", JOBSAPP_CODE="fixed")
    assert done.returncode == 0, done.stderr
    wait_until(lambda: len(_effects("charge-")) == COUNT, 30, message="every replayed message ran")
    time.sleep(1.0)  # a second run would show by now
    effects = _effects("charge-")
    assert sorted(effects) == sorted(f"charge-{invoice_id}-EUR" for invoice_id in range(COUNT)), "each once"
    assert DeadLetter.objects.filter(actor="deploy_charge", status=DeadLetter.Status.REPLAYED).count() == COUNT
    assert ProcessedMessage.objects.filter(actor="deploy_charge").count() == COUNT


def test_workers_before_web_a_job_only_the_new_code_has_waits_on_an_old_worker_and_runs_once_on_a_new_one(
        worker_processes) -> None:  # type: ignore[no-untyped-def]
    old = worker_processes.spawn(HOST_ARGS, **_code("old", 60))
    # The new web publishes deploy_refund, which the old code has not heard of: written as its
    # publish() writes it, and relayed by the old host (a relay needs no actor).
    OutboxMessage.objects.bulk_create(OutboxMessage(actor_name="deploy_refund", queue_name=DEPLOY_QUEUE,
                                                    payload={"invoice_id": invoice_id}) for invoice_id in range(COUNT))
    wait_until(lambda: not OutboxMessage.objects.filter(actor_name="deploy_refund",
                                                        status=OutboxMessage.Status.PENDING).exists(), 15,
               message="relayed by the old host")
    time.sleep(2.0)  # each refused at least once, and put back
    assert _effects("refund-") == [] and not DeadLetter.objects.exists()
    # The rolling deploy reaches the workers: a new host comes up, the old one goes.
    worker_processes.spawn(HOST_ARGS, **_code("new", 60))
    old.terminate()
    wait_until(lambda: len(_effects("refund-")) == COUNT, 30, message="every waiting message ran on the new code")
    time.sleep(1.0)
    assert sorted(_effects("refund-")) == sorted(f"refund-{invoice_id}" for invoice_id in range(COUNT))
    assert not DeadLetter.objects.exists()


def _message_count(queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


@pytest.mark.rabbitmq
@pytest.mark.empty_queues(DEPLOY_QUEUE, RELAY_QUEUE_NAME, rabbitmq=True)
@pytest.mark.usefixtures("nudge_only")
def test_on_rabbitmq_an_unknown_job_waits_out_of_the_broker_s_dead_letter_queue_and_is_parked_once(
        worker_processes) -> None:  # type: ignore[no-untyped-def]
    host = worker_processes.spawn(HOST_ARGS, **_code("old", 4.0, BROKER_URL=RABBITMQ_URL))
    OutboxMessage.objects.bulk_create(OutboxMessage(actor_name="deploy_refund", queue_name=DEPLOY_QUEUE,
                                                    payload={"invoice_id": invoice_id}) for invoice_id in range(COUNT))
    wait_until(lambda: WAITS in host.output(), 30, message="the old host refused a message of an unknown job")
    # Accepted by the consumer (a stand-in answers the unknown name), put back as a copy and
    # acknowledged: while it waits, not one is rejected into RabbitMQ's dead-letter queue.
    time.sleep(1.0)
    assert _message_count(xq_name(DEPLOY_QUEUE)) == 0 and not DeadLetter.objects.exists()
    wait_until(lambda: DeadLetter.objects.filter(actor="deploy_refund").count() == COUNT, 30,
               message="every unknown-job message parked")
    assert set(DeadLetter.objects.values_list("error_class", flat=True)) == {INCOMPATIBLE}
    assert "no job named 'deploy_refund' here" in DeadLetter.objects.first().error_message  # type: ignore[union-attr]
    # Parked, each is rejected once, as every dead letter is on RabbitMQ (its expiring copy).
    wait_until(lambda: _message_count(xq_name(DEPLOY_QUEUE)) == COUNT, 10, message="one broker copy each")
    assert _effects("refund-") == []
