"""Rows committed but left to the relay, for tests of the relay and of what it repairs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["left_to_the_relay"]

_lock = threading.Lock()
_depth = 0


@contextmanager
def left_to_the_relay() -> Iterator[None]:
    """Inside the block ``publish()`` in this process (any thread) writes its rows unleased and,
    after COMMIT, only nudges the relay instead of sending them: they stay pending for a test to
    relay by hand (``Relay(broker).run_until_idle()``), or to watch a worker's relay take."""
    # Late: composition.testing is imported by settings modules, before the app registry exists.
    from composition.outbox.publish import LEFT_TO_THE_RELAY

    global _depth
    with _lock:
        _depth += 1
        LEFT_TO_THE_RELAY.set()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:  # an inner block's end leaves an outer one's in force
                LEFT_TO_THE_RELAY.clear()
