"""``QueueOrder`` (the ``--queues`` text) and ``OrderedWorkQueue`` (Dramatiq's work queue taking
work in that order), driven by real threads as Dramatiq's worker threads drive it: ``get``, run,
``task_done``."""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from dramatiq import Message
from dramatiq.broker import MessageProxy
from dramatiq.common import dq_name, iter_queue
from dramatiq.worker import _WorkQueueItem

from composition.jobs.queue_order import OrderedWorkQueue, QueueOrder
from composition.outbox.relay import RELAY_QUEUE_NAME

# How long a waiting thread may take to notice work it may take: far below a worker's idle poll.
TAKEN_AT_ONCE_S = 0.1


def _item(queue_name: str, priority: int = 0, tag: str = "") -> _WorkQueueItem:
    message: Message[Any] = Message(queue_name=queue_name, actor_name="noop", args=(), kwargs={}, options={"tag": tag})
    return _WorkQueueItem(priority, MessageProxy(message))


def _queue_of(item: _WorkQueueItem) -> str:
    return str(item.message.queue_name)



def _wait_for(done: Callable[[], bool], *, timeout_s: float, poll_s: float) -> None:
    """Poll ``done`` until it holds or ``timeout_s`` passes; the test's own asserts say which."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(poll_s)

class Threads:
    """``count`` worker threads: each takes an item, holds it ``hold_s`` (counting how many of
    each queue are held at once), then calls ``task_done``, until stopped."""

    def __init__(self, work: OrderedWorkQueue, count: int, hold_s: float) -> None:
        self.work = work
        self.hold_s = hold_s
        self.taken: list[tuple[str, float]] = []
        self.held: Counter[str] = Counter()
        # The most items of queues other than the first held at once.
        self.most_held_others = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]

    def start(self) -> Threads:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop taking work, and wait for the items held to be done (again: a no-op)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        assert not any(thread.is_alive() for thread in self._threads)

    def held_others(self) -> int:
        with self._lock:
            return self._held_others()

    def _held_others(self) -> int:
        first = self.work.order.names[0]
        return sum(count for name, count in self.held.items() if name != first)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = self.work.get(timeout=0.05)
            except queue.Empty:
                continue
            name = _queue_of(item)
            with self._lock:
                self.taken.append((name, time.monotonic()))
                self.held[name] += 1
                self.most_held_others = max(self.most_held_others, self._held_others())
            time.sleep(self.hold_s)
            with self._lock:
                self.held[name] -= 1
            self.work.task_done()


@pytest.fixture
def started() -> Iterator[list[Threads]]:
    """Threads started by a test, stopped at its end whatever happens."""
    pools: list[Threads] = []
    yield pools
    for pool in pools:
        pool.stop()


# QueueOrder.parse


def test_a_plain_list_is_a_strict_order() -> None:
    order = QueueOrder.parse(" critical, default ,bulk")
    assert order == QueueOrder(names=("critical", "default", "bulk"), weights=None)
    assert str(order) == "critical,default,bulk"


def test_weights_follow_the_names_and_the_text_parses_back() -> None:
    order = QueueOrder.parse("critical=4,default=2, bulk = 1")
    assert order.names == ("critical", "default", "bulk")
    assert order.weights == (4, 2, 1)
    assert QueueOrder.parse(str(order)) == order


def test_the_setting_may_be_a_list_of_entries() -> None:
    assert QueueOrder.parse(["critical=4", "default=2", "bulk=1"]) == QueueOrder.parse("critical=4,default=2,bulk=1")
    assert QueueOrder.parse(["a", "b"]) == QueueOrder(names=("a", "b"))


def test_the_relay_queue_takes_no_weight_and_is_consumed_first_wherever_it_is_listed() -> None:
    order = QueueOrder.parse(f"critical=4,bulk=1,{RELAY_QUEUE_NAME}")
    assert order == QueueOrder(names=("critical", "bulk"), weights=(4, 1), relay_listed=True)
    assert order.queues == (RELAY_QUEUE_NAME, "critical", "bulk")
    assert str(order) == f"{RELAY_QUEUE_NAME},critical=4,bulk=1"
    assert QueueOrder.parse(str(order)) == order
    alone = QueueOrder.parse(RELAY_QUEUE_NAME)
    assert alone.queues == (RELAY_QUEUE_NAME,) and not alone.orders_several


def test_only_several_queues_besides_the_relay_make_an_order() -> None:
    assert not QueueOrder.parse(f"a,{RELAY_QUEUE_NAME}").orders_several
    assert not QueueOrder.parse("a=3").orders_several
    assert QueueOrder.parse("a,b").orders_several


@pytest.mark.parametrize(("spec", "says"), [
    ("", "names no queue"),
    (",", "names no queue"),
    ([], "names no queue"),
    ("a,,b", "empty queue name"),
    ("a,b,", "empty queue name"),
    ("=3,b=1", "empty queue name"),
    ("a=4,b", "mixes"),
    (["a", "b=2"], "mixes"),
    ("a=0,b=1", "at least 1"),
    ("a=-1,b=1", "at least 1"),
    ("a=1.5,b=1", "whole number"),
    ("a=x,b=1", "whole number"),
    ("a=,b=1", "whole number"),
    ("a,b,a", "queue 'a' twice"),
    ("a=2,a=1", "queue 'a' twice"),
    (f"{RELAY_QUEUE_NAME},a,{RELAY_QUEUE_NAME}", f"queue '{RELAY_QUEUE_NAME}' twice"),
    (f"{RELAY_QUEUE_NAME}=2,a=1", "it takes none"),
])
def test_a_bad_order_is_refused_with_what_is_wrong(spec: str | list[str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        QueueOrder.parse(spec)


@pytest.mark.parametrize(("spec", "threads", "reserved"), [
    ("critical=4,default=2,bulk=1", 8, 4),  # 8 * 4 // 7
    ("critical=4,bulk=1", 4, 3),  # 16 // 5
    ("critical=1,bulk=1", 4, 2),
    ("critical=1,bulk=9", 4, 1),  # 4 // 10 is 0: the first queue keeps one thread all the same
    ("critical=100,bulk=1", 4, 3),  # at most threads - 1: the others keep one
    ("critical=4,bulk=1", 2, 1),
    ("critical=4,bulk=1", 1, 0),  # one thread cannot be split
    ("critical,default,bulk", 8, 0),  # strict: nothing reserved, the order alone decides
])
def test_threads_reserved_for_the_first_queue(spec: str, threads: int, reserved: int) -> None:
    assert QueueOrder.parse(spec).reserved_threads(threads) == reserved


# OrderedWorkQueue


def test_strict_a_free_thread_takes_from_the_first_non_empty_queue(started: list[Threads]) -> None:
    work = OrderedWorkQueue(QueueOrder.parse(f"a,b,c,{RELAY_QUEUE_NAME}"), threads=1)
    for index in range(3):
        for name in ("c", "b", "unlisted", "a", RELAY_QUEUE_NAME):
            work.put(_item(name, tag=str(index)))
    work.put(_item(dq_name("b"), tag="from the delay queue"))  # a delay queue's message is its queue's
    work.put(_item("a", priority=-1, tag="urgent"))  # within a queue, Dramatiq's order: priority first
    assert work.qsize() == 17
    pool = Threads(work, count=1, hold_s=0.0)
    started.append(pool.start())
    _wait_for(lambda: len(pool.taken) >= 17, timeout_s=5, poll_s=0.01)
    pool.stop()
    order = [name for name, _ in pool.taken]
    assert order == [RELAY_QUEUE_NAME] * 3 + ["a"] * 4 + ["b", "b", "b", dq_name("b")] + ["c"] * 3 + ["unlisted"] * 3
    assert work.qsize() == 0 and work.empty()


def test_strict_order_within_a_queue_is_dramatiq_s() -> None:
    work = OrderedWorkQueue(QueueOrder.parse("a,b"), threads=1)
    for tag, priority in (("late", 10), ("first", 0), ("second", 0), ("urgent", -5)):
        work.put(_item("a", priority=priority, tag=tag))
    assert [item.message.options["tag"] for item in iter_queue(work)] == ["urgent", "first", "second", "late"]


def test_weighted_shares_follow_the_weights_when_every_queue_is_full(started: list[Threads]) -> None:
    work = OrderedWorkQueue(QueueOrder.parse("a=4,b=2,c=1"), threads=8)
    for _ in range(400):
        for name in ("a", "b", "c"):
            work.put(_item(name))
    pool = Threads(work, count=8, hold_s=0.002)
    started.append(pool.start())
    _wait_for(lambda: len(pool.taken) >= 350, timeout_s=20, poll_s=0.01)
    pool.stop()
    shares = Counter(name for name, _ in pool.taken[:350])
    assert shares["a"] / 350 == pytest.approx(4 / 7, abs=0.06), shares
    assert shares["b"] / 350 == pytest.approx(2 / 7, abs=0.06), shares
    assert shares["c"] / 350 == pytest.approx(1 / 7, abs=0.06), shares


def test_with_the_first_queue_empty_at_most_threads_minus_k_run_the_others(started: list[Threads]) -> None:
    order = QueueOrder.parse("a=4,b=2,c=1")
    assert order.reserved_threads(8) == 4
    work = OrderedWorkQueue(order, threads=8)
    for _ in range(60):
        work.put(_item("b"))
        work.put(_item("c"))
    pool = Threads(work, count=8, hold_s=0.01)
    started.append(pool.start())
    _wait_for(lambda: len(pool.taken) >= 120, timeout_s=20, poll_s=0.01)
    pool.stop()
    assert len(pool.taken) == 120
    # b and c together, never more than 8 - 4 at once, and the 4 are used.
    assert pool.most_held_others == 4


def test_a_first_queue_item_is_taken_at_once_while_the_others_hold_their_threads(started: list[Threads]) -> None:
    work = OrderedWorkQueue(QueueOrder.parse("critical=4,default=2,bulk=1"), threads=8)
    for _ in range(20):
        work.put(_item("bulk"))
    pool = Threads(work, count=8, hold_s=0.6)
    started.append(pool.start())
    _wait_for(lambda: pool.held_others() >= 4, timeout_s=5, poll_s=0.005)
    time.sleep(0.1)  # the four free threads have seen the bulk work and wait
    assert pool.held_others() == 4
    put_at = time.monotonic()
    work.put(_item("critical"))
    _wait_for(lambda: any(name == "critical" for name, _ in pool.taken), timeout_s=5, poll_s=0.001)
    taken_at = next(at for name, at in pool.taken if name == "critical")
    assert taken_at - put_at < TAKEN_AT_ONCE_S
    assert pool.held_others() == 4
    assert work.qsize() == 16  # the bulk work still waiting, though no free thread may take it now


def test_a_waiting_thread_takes_capped_work_as_soon_as_a_capped_job_ends() -> None:
    order = QueueOrder.parse("critical=4,bulk=1")
    work = OrderedWorkQueue(order, threads=4)  # one thread may run bulk work
    work.put(_item("bulk", tag="first"))
    work.put(_item("bulk", tag="second"))
    assert work.get_nowait().message.options["tag"] == "first"
    got: list[float] = []

    def waiter() -> None:
        work.get(timeout=5)
        got.append(time.monotonic())

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    time.sleep(0.2)
    assert not got, "the second bulk item waits while the first runs"
    ended_at = time.monotonic()
    work.task_done()  # and this thread takes nothing more
    thread.join(5)
    assert got and got[0] - ended_at < TAKEN_AT_ONCE_S


def test_at_stop_every_item_left_comes_out_once_no_job_runs(started: list[Threads]) -> None:
    work = OrderedWorkQueue(QueueOrder.parse(f"critical=4,bulk=1,{RELAY_QUEUE_NAME}"), threads=4)
    for index in range(30):
        work.put(_item("bulk", tag=f"bulk-{index}"))
    for index in range(5):
        work.put(_item("critical", tag=f"critical-{index}"))
        work.put(_item("unlisted", tag=f"unlisted-{index}"))
    pool = Threads(work, count=4, hold_s=0.01)
    started.append(pool.start())
    _wait_for(lambda: len(pool.taken) >= 10, timeout_s=5, poll_s=0.001)
    pool.stop()
    work.put(_item(RELAY_QUEUE_NAME, tag="relay"))
    left = work.qsize()
    assert left == 41 - len(pool.taken)
    # As Worker.stop hands them back: one thread, many get_nowait() calls, no task_done.
    handed_back = list(iter_queue(work))
    assert len(handed_back) == left
    tags = [item.message.options["tag"] for item in handed_back] + [None] * len(pool.taken)
    assert len(set(tags) - {None}) == left
    assert work.qsize() == 0


def test_join_returns_once_every_task_is_done(started: list[Threads]) -> None:
    work = OrderedWorkQueue(QueueOrder.parse("critical=4,bulk=1"), threads=4)
    for _ in range(10):
        work.put(_item("bulk"))
        work.put(_item("critical"))
    pool = Threads(work, count=4, hold_s=0.005)
    started.append(pool.start())
    joined = threading.Thread(target=work.join, daemon=True)
    joined.start()
    joined.join(10)
    assert not joined.is_alive() and work.unfinished_tasks == 0
    pool.stop()
