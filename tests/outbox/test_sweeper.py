"""The relay sweeper against real PostgreSQL and a broker it cannot reach."""

from __future__ import annotations

import pytest
from django.db import transaction
from prometheus_client import REGISTRY

from composition.broker.configured import build_broker
from composition.metrics import OUTBOX_OLDEST_PENDING_AGE_SECONDS, OUTBOX_PENDING
from composition.outbox import OutboxMessage, publish
from composition.outbox.sweeper import RelaySweeperComponent
from composition.testing import free_port, left_to_the_relay
from tests.outboxapp.jobs import record_effect


@pytest.mark.django_db(transaction=True)
def test_a_round_the_broker_fails_still_samples_the_backlog_it_leaves() -> None:
    # The gauges were sampled only after a round that did not raise: with the broker down they
    # froze at their last reading (1 row, 2 s old) while the backlog grew, and nothing paged.
    down = build_broker(f"redis://127.0.0.1:{free_port()}/0", heartbeat_timeout_s=4, maintenance_chance=0,
                        socket_timeout_s=0.3, connect_timeout_s=0.3)
    sweeper = RelaySweeperComponent(down)
    with left_to_the_relay(), transaction.atomic():
        for seq in range(3):
            publish(record_effect, {"seq": seq})
    OUTBOX_PENDING.set(0)
    OUTBOX_OLDEST_PENDING_AGE_SECONDS.set(0)
    with pytest.raises(Exception, match=r"(?i)connect"):
        sweeper.sweep()
    assert OutboxMessage.objects.filter(status=OutboxMessage.Status.PENDING).count() == 3
    assert REGISTRY.get_sample_value("composition_outbox_pending_messages") == 3
    assert (REGISTRY.get_sample_value("composition_outbox_oldest_pending_age_seconds") or 0) > 0


@pytest.mark.django_db(transaction=True)
def test_a_failed_round_whose_sampling_fails_too_raises_the_round_s_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # The sampling's error (the database down too) replaced the broker's in the sweep's log line.
    from django.db import OperationalError
    from structlog.testing import capture_logs

    from composition.outbox import sweeper as module

    down = build_broker(f"redis://127.0.0.1:{free_port()}/0", heartbeat_timeout_s=4, maintenance_chance=0,
                        socket_timeout_s=0.3, connect_timeout_s=0.3)
    sweeper = RelaySweeperComponent(down)
    with left_to_the_relay(), transaction.atomic():
        publish(record_effect, {"seq": 1})

    def database_down() -> tuple[int, float]:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(module, "refresh_gauges", database_down)
    with capture_logs() as logs, pytest.raises(Exception, match=r"(?i)connect") as raised:
        sweeper.sweep()
    assert not isinstance(raised.value, OperationalError)
    assert [entry["error"] for entry in logs if entry["event"] == "outbox gauges not sampled"] == [
        "OperationalError: server closed the connection unexpectedly"]
