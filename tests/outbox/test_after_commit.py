"""The after-commit nudge must not make requests pay for a frozen broker: a circuit breaker per
broker skips the nudge while the broker is failing, and the sweep relays what it missed."""

from __future__ import annotations

import json
import time

import dramatiq
import pytest
from django.db import transaction

from composition.conf import conf
from composition.outbox import OutboxMessage, publish
from composition.outbox.after_commit import NUDGE_BREAKER_RESET_S
from composition.outbox.relay import Relay
from composition.testing import ThrowawayRedis, use_broker, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

MESSAGES = 20


def _probe(seq: int) -> None:
    """Never consumed: the test reads what reached the broker."""


@pytest.mark.usefixtures("nudge_only")
def test_publishing_against_a_frozen_broker_costs_at_most_one_socket_timeout(
        throwaway_redis_server: ThrowawayRedis) -> None:
    with use_broker(throwaway_redis_server.url) as broker:
        probe = dramatiq.actor(actor_name="nudge_probe", queue_name="nudge_probe", broker=broker,
                               max_retries=0)(_probe)
        publish(probe, {"seq": -1})  # a healthy broker: the nudge goes through
        assert broker.client.llen("dramatiq:composition.outbox") == 1  # type: ignore[attr-defined]

        throwaway_redis_server.freeze()
        try:
            started = time.monotonic()
            for seq in range(MESSAGES):
                with transaction.atomic():
                    publish(probe, {"seq": seq})
            took_s = time.monotonic() - started
        finally:
            throwaway_redis_server.thaw()

        # Without the breaker every commit would wait for the socket timeout (20 x 2 s).
        timeout_s = float(conf.BROKER_SOCKET_TIMEOUT_S)
        assert took_s < timeout_s * 1.5 + 2.0, f"{MESSAGES} publishes took {took_s:.1f}s"

        # Every row committed and waits for the sweep, which relays it once the broker is back.
        pending = OutboxMessage.objects.filter(actor_name="nudge_probe", status="pending")
        assert pending.count() == MESSAGES + 1  # the first one's nudge is queued but nobody ran it
        assert Relay(broker).run_until_idle() == MESSAGES + 1
        queued = broker.client.lrange("dramatiq:nudge_probe", 0, -1)  # type: ignore[attr-defined]
        assert len(queued) == MESSAGES + 1


def test_sending_on_commit_to_a_frozen_broker_costs_at_most_one_socket_timeout(
        throwaway_redis_server: ThrowawayRedis) -> None:
    with use_broker(throwaway_redis_server.url) as broker:
        probe = dramatiq.actor(actor_name="send_probe", queue_name="send_probe", broker=broker,
                               max_retries=0)(_probe)
        publish(probe, {"seq": -1})  # a healthy broker: sent at once, no relay involved
        assert broker.client.llen("dramatiq:send_probe") == 1  # type: ignore[attr-defined]
        assert broker.client.llen("dramatiq:composition.outbox") == 0  # type: ignore[attr-defined]
        assert OutboxMessage.objects.get(actor_name="send_probe").status == "sent"

        throwaway_redis_server.freeze()
        try:
            started = time.monotonic()
            for seq in range(MESSAGES):
                with transaction.atomic():
                    publish(probe, {"seq": seq})
            took_s = time.monotonic() - started
        finally:
            throwaway_redis_server.thaw()

        # The first send after COMMIT waited one socket timeout; the breaker then skipped the
        # others' sends, so the commits after it never waited for the broker.
        timeout_s = float(conf.BROKER_SOCKET_TIMEOUT_S)
        assert took_s < timeout_s * 1.5 + 1.0, f"{MESSAGES} publishes took {took_s:.1f}s"
        # The failed send released its claim at once: the sweep relays every row, once.
        assert OutboxMessage.objects.filter(actor_name="send_probe", status="pending").count() == MESSAGES
        assert Relay(broker).run_until_idle() == MESSAGES
        # At least once: the send that timed out may still have reached the broker when it thawed.
        queued = broker.client.lrange("dramatiq:send_probe", 0, -1)  # type: ignore[attr-defined]
        assert MESSAGES + 1 <= len(queued) <= MESSAGES + 2


def test_while_the_broker_stays_frozen_only_the_first_commit_waits_and_sends_resume_once_it_is_back(
        throwaway_redis_server: ThrowawayRedis) -> None:
    # The breaker's half-open trial was a caller's send: one commit per process waited out the
    # socket timeout every NUDGE_BREAKER_RESET_S for as long as the broker stayed frozen.
    with use_broker(throwaway_redis_server.url) as broker:
        probe = dramatiq.actor(actor_name="frozen_probe", queue_name="frozen_probe", broker=broker,
                               max_retries=0)(_probe)
        publish(probe, {"seq": -1})
        timeout_s = float(conf.BROKER_SOCKET_TIMEOUT_S)
        took: list[float] = []
        throwaway_redis_server.freeze()
        try:
            until = time.monotonic() + 2 * NUDGE_BREAKER_RESET_S + 2 * timeout_s
            while time.monotonic() < until:
                started = time.monotonic()
                with transaction.atomic():
                    publish(probe, {"seq": len(took)})
                took.append(time.monotonic() - started)
                time.sleep(0.1)
        finally:
            throwaway_redis_server.thaw()
        assert took[0] >= timeout_s / 2, "the first commit found the broker frozen"
        assert max(took[1:]) < timeout_s / 2, f"a later commit waited {max(took[1:]):.1f}s for the frozen broker"

        def sent_at_once() -> bool:
            with transaction.atomic():
                row = publish(probe, {"seq": -2})
            return OutboxMessage.objects.get(pk=row.pk).status == "sent"

        # Back: a probe closes the circuit within a reset period, and commits send again.
        wait_until(sent_at_once, timeout_s=NUDGE_BREAKER_RESET_S + timeout_s + 5, interval_s=0.5,
                   message="commits did not send to the broker once it was back")
        Relay(broker).run_until_idle()
        bodies = broker.client.hvals("dramatiq:frozen_probe.msgs")  # type: ignore[attr-defined]
        queued = {json.loads(body)["kwargs"]["seq"] for body in bodies}
        assert set(range(len(took))) <= queued, "every commit's message reached the broker"
