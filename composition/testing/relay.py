"""Rows committed but left to the relay, for tests of the relay and of what it repairs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["left_to_the_relay"]


@contextmanager
def left_to_the_relay() -> Iterator[None]:
    """Inside the block ``publish()`` in this process (any thread) writes its rows unleased and,
    after COMMIT, only nudges the relay instead of sending them: they stay pending for a test to
    relay by hand (``Relay(broker).run_until_idle()``), or to watch a worker's relay take."""
    # Late: composition.testing is imported by settings modules, before the app registry exists.
    from composition.outbox.publish import LEFT_TO_THE_RELAY

    LEFT_TO_THE_RELAY.set()
    try:
        yield
    finally:
        LEFT_TO_THE_RELAY.clear()
