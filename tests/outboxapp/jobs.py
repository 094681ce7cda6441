"""Jobs used only by the tests (declared at app ready)."""

from __future__ import annotations

import dramatiq
from django.db import close_old_connections

from composition.broker.configured import configured_broker

QUEUE = "outboxapp"


def _record_effect(seq: int, order_id: int | None = None) -> None:
    from tests.outboxapp.models import Effect

    close_old_connections()
    try:
        Effect.objects.create(seq=seq, order_id=order_id)
    finally:
        close_old_connections()


def _noop(seq: int, key: str | None = None) -> None:
    """Never consumed in the relay tests: they count what reached the broker."""


record_effect = dramatiq.actor(actor_name="outboxapp_record_effect", queue_name=QUEUE,
                               broker=configured_broker(), max_retries=0)(_record_effect)
# Its own queue with no worker on it, so a test can read exactly what the relay enqueued.
relay_probe = dramatiq.actor(actor_name="outboxapp_relay_probe", queue_name="outboxapp_probe",
                             broker=configured_broker(), max_retries=0)(_noop)
