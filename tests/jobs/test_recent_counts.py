"""``RecentCounts``: events per kind over a sliding window of one-second buckets (the worker's
runs per queue in its heartbeat). A test clock drives time."""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Iterator

import pytest

from composition.jobs.recent_counts import RecentCounts
from tests.helpers import Clock


def test_counts_add_up_per_kind_within_and_across_seconds() -> None:
    clock = Clock(1000.0)
    counts = RecentCounts(60, clock=clock)
    assert counts.totals() == {}
    counts.add("billing")
    counts.add("billing", 4)
    clock.now += 0.5  # the same second
    counts.add("emails")
    clock.now += 1
    counts.add("billing", 2)
    assert counts.totals() == {"billing": 7, "emails": 1}


def test_an_event_leaves_the_window_once_it_is_window_s_old() -> None:
    clock = Clock(1000.0)
    counts = RecentCounts(300, clock=clock)
    counts.add("billing", 3)  # at second 1000
    clock.now += 10
    counts.add("billing")  # at second 1010
    clock.now = 1299.99
    assert counts.totals() == {"billing": 4}, "still within 300 s"
    clock.now = 1300.0
    assert counts.totals() == {"billing": 1}, "the events of second 1000 are 300 s old"
    clock.now = 1310.0
    assert counts.totals() == {}, "a kind with nothing left is left out"
    counts.add("billing")
    assert counts.totals() == {"billing": 1}, "a kind counts again after an idle window"


def test_adding_drops_old_buckets_so_a_busy_kind_keeps_a_window_s_worth() -> None:
    # Bucket count bounded by the window: the only memory a rate costs, however busy.
    clock = Clock(1000.0)
    counts = RecentCounts(5, clock=clock)
    for _ in range(100):
        counts.add("billing", 4)
        counts.add("billing", 6)  # the same second: the same bucket
        clock.now += 1
    # Read before totals(), which drops old buckets too.
    assert sum(len(buckets) for buckets in counts._buckets.values()) == 5
    clock.now -= 1  # the second of the last add
    assert counts.totals() == {"billing": 50}


@pytest.fixture
def frequent_thread_switches() -> Iterator[None]:
    """The interpreter switches threads every 10 µs, not 5 ms: a reader is then interrupted
    inside its sum, where a race shows."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(previous)


@pytest.mark.usefixtures("frequent_thread_switches")
def test_reads_while_other_threads_add_never_fail_and_lose_no_event() -> None:
    # A clock that moves a second per reading: every add opens a bucket, while the reader sums
    # thousands of them (unlocked, its iteration saw the deque mutate under it and raised).
    ticks = itertools.count()
    counts = RecentCounts(10**9, clock=lambda: float(next(ticks)))
    for _ in range(5000):
        counts.add("billing")
    writers, adds, reads = 4, 2000, 50
    errors: list[BaseException] = []

    def write(writer: int) -> None:
        try:
            for _ in range(adds):
                counts.add("billing")
                counts.add(f"kind-{writer}")
        except BaseException as exc:
            errors.append(exc)

    def read() -> None:
        try:
            for _ in range(reads):
                counts.totals()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(writer,)) for writer in range(writers)]
    threads.append(threading.Thread(target=read))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    totals = counts.totals()
    assert totals == {"billing": 5000 + writers * adds, **{f"kind-{writer}": adds for writer in range(writers)}}
