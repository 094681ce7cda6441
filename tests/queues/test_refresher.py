"""``QueuePauseRefresher``: the process's copy of the paused queues is read before ``start``
returns, follows changes within a round, sets ``composition_queue_paused`` and goes on the
heartbeat; ``stop`` forgets it."""

from __future__ import annotations

import pytest

from composition.broker.pausing import paused_queues
from composition.lifecycle.heartbeat import HeartbeatComponent
from composition.queues import QueuePauseRefresher, pause_queue, resume_queue
from composition.testing import wait_until
from composition.testing.metrics import metric_value
from tests.jobsapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = jobs.PAUSE_QUEUE


def test_a_pause_is_read_before_start_returns_then_followed_round_by_round() -> None:
    pause_queue(QUEUE, by="tests")
    refresher = QueuePauseRefresher(interval_s=0.05)
    refresher.start()
    try:
        assert QUEUE in paused_queues  # before any worker thread would start
        assert metric_value("composition_queue_paused", queue=QUEUE) == 1
        beat = HeartbeatComponent(60.0).state()
        assert beat["paused_queues"] == [QUEUE]

        resume_queue(QUEUE, by="tests")
        wait_until(lambda: QUEUE not in paused_queues, timeout_s=2)
        assert metric_value("composition_queue_paused", queue=QUEUE) == 0
        pause_queue(QUEUE, by="tests")
        wait_until(lambda: QUEUE in paused_queues, timeout_s=2)
    finally:
        refresher.stop(5)
        resume_queue(QUEUE, by="tests")
    assert paused_queues.names == frozenset()


def test_a_wait_on_the_set_ends_at_the_next_change() -> None:
    import threading
    import time

    woke: list[float] = []
    waiter = threading.Thread(target=lambda: (paused_queues.wait(5.0), woke.append(time.monotonic())))
    waiter.start()
    time.sleep(0.1)
    changed_at = time.monotonic()
    assert paused_queues.replace({QUEUE})
    assert not paused_queues.replace({QUEUE})  # the same set: no change
    waiter.join(2)
    paused_queues.replace(())
    assert woke and woke[0] - changed_at < 1.0
