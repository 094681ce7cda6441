"""Billing's background jobs (declared against the configured broker at app ready)."""

from __future__ import annotations

import dramatiq

from composition.broker import configured_broker


@dramatiq.actor(broker=configured_broker(), queue_name="default")
def ping(token: str) -> None:
    """A no-op job used by smoke tests and benchmarks."""
