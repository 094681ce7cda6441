"""The races cache-aside must survive: stampedes on a cold key (threads and processes) and the
stale back-fill race of delete-on-write caching."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections, transaction

from composition.cache import cache_aside, cache_aside_result, get_cache_aside, invalidate, invalidate_namespace
from composition.cache.engine import CacheAside, CacheResult
from composition.cache.flights import Flight
from composition.cache.serializers import load_serializer
from composition.conf import conf
from composition.locks.models import LockFence
from composition.testing import free_port, metric_value, wait_until
from tests.cache.test_outage import cache_at, timed_calls
from tests.helpers import unique

LOADER_S = 0.2


def test_stampede_64_threads_one_loader_call() -> None:
    key = f"{unique('race')}:cold"
    calls = 0
    calls_lock = threading.Lock()

    def loader() -> dict[str, int]:
        nonlocal calls
        with calls_lock:
            calls += 1
        time.sleep(LOADER_S)
        return {"answer": 42}

    barrier = threading.Barrier(64)
    results: list[CacheResult] = []

    def reader() -> None:
        barrier.wait()
        results.append(cache_aside_result(key, loader, ttl_s=30))

    threads = [threading.Thread(target=reader) for _ in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert calls == 1
    assert len(results) == 64
    assert all(result.value == {"answer": 42} for result in results)
    assert sorted({result.outcome for result in results}) == ["coalesced", "loaded"]


def test_a_stampede_right_as_the_epoch_is_checked_loads_once_and_caches_it(monkeypatch: Any) -> None:
    """The threads that arrived while one checked the epoch went on with the one it replaced:
    their rebuild, versioned before the epoch came back, was refused at the fill (uncached), and
    the key was loaded twice. The check is slowed down (a thread descheduled in it, a first
    connection), so the others surely arrive meanwhile."""
    from composition.cache.store import LeaseStore

    check = LeaseStore.ensure_epoch

    def slow_check(self: LeaseStore, *args: Any) -> tuple[bool, bytes]:
        time.sleep(0.05)
        return check(self, *args)

    monkeypatch.setattr(LeaseStore, "ensure_epoch", slow_check)
    engine = get_cache_aside()
    for round_ in range(3):
        key = f"{unique('epoch-race')}:{round_}"
        engine.client.delete(engine.keys.epoch)  # evicted, or a new server: the next check restores it
        engine.epoch.recheck()
        calls, outcomes = _stampede(key, 50)
        assert calls == 1, f"round {round_}: {calls} loads ({outcomes})"
        assert outcomes.count("loaded") == 1, f"round {round_}: {outcomes}"
        assert engine.peek(key) == 7, f"round {round_}: the one load was not cached ({outcomes})"


def test_a_check_that_hangs_holds_other_threads_a_bounded_while_and_a_recheck_during_it_is_kept(
        monkeypatch: Any) -> None:
    # Against a Redis that hangs, the waiters sat out the check's socket timeout, then their own;
    # and a recheck asked for during a check (the breaker closing) was lost until the next second.
    from composition.cache.epoch import CHECK_WAIT_S, EPOCH_CHECK_S
    from composition.cache.store import LeaseStore

    check = LeaseStore.ensure_epoch
    calls: list[float] = []

    def hanging_check(self: LeaseStore, *args: Any) -> tuple[bool, bytes]:
        calls.append(time.monotonic())
        time.sleep(0.6)
        return check(self, *args)

    monkeypatch.setattr(LeaseStore, "ensure_epoch", hanging_check)
    epoch = get_cache_aside().epoch
    epoch.recheck()
    checking = threading.Thread(target=epoch.current)
    checking.start()
    wait_until(lambda: calls, 5, interval_s=0.01)
    started = time.monotonic()
    epoch.current()  # another thread's read meanwhile
    assert time.monotonic() - started < CHECK_WAIT_S + 0.2
    epoch.recheck()  # asked for while the check runs
    checking.join(5)
    epoch.current()
    assert len(calls) == 2, "the recheck asked for during the check was dropped"
    epoch.current()
    assert len(calls) == 2, f"checked again within EPOCH_CHECK_S ({EPOCH_CHECK_S} s)"


def _stampede(key: str, threads: int) -> tuple[int, list[str]]:
    """``threads`` threads released at once on ``key`` with a slow loader: its calls, and the
    outcomes in order."""
    calls = 0
    calls_lock = threading.Lock()

    def loader() -> int:
        nonlocal calls
        with calls_lock:
            calls += 1
        time.sleep(LOADER_S)
        return 7

    barrier = threading.Barrier(threads)
    results: list[CacheResult] = []

    def reader() -> None:
        barrier.wait()
        results.append(cache_aside_result(key, loader, ttl_s=30))

    started = [threading.Thread(target=reader) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(10)
    return calls, sorted(result.outcome for result in results)


def test_a_thread_waits_for_another_s_rebuild_as_long_as_a_process_would(settings: Any) -> None:
    """Then it loads uncached, as a process waiting out the lease does; a loader asking for its
    own key raises instead of waiting on itself for good."""
    settings.COMPOSITION = {**settings.COMPOSITION, "CACHE_LEASE_WAIT_S": 0.3}
    key = f"{unique('slow')}:1"
    started = threading.Event()

    def slow() -> str:
        started.set()
        time.sleep(2.0)
        return "slow"

    leader = threading.Thread(target=lambda: cache_aside(key, slow, ttl_s=30))
    leader.start()
    assert started.wait(5)
    began = time.monotonic()
    result = cache_aside_result(key, lambda: "mine", ttl_s=30)
    waited = time.monotonic() - began
    leader.join(10)
    assert (result.value, result.outcome) == ("mine", "uncached")
    assert waited < 1.5, waited

    own = f"{unique('own')}:1"
    with pytest.raises(RuntimeError, match="asked for that key itself"):
        cache_aside(own, lambda: cache_aside(own, lambda: 1, ttl_s=5) + 1, ttl_s=5)
    assert cache_aside_result(own, lambda: 2, ttl_s=5).value == 2  # the key is not stuck


def _process_reader(key: str, barrier: Any, calls: Any, out: Any) -> None:
    def loader() -> dict[str, int]:
        with calls.get_lock():
            calls.value += 1
        time.sleep(LOADER_S)
        return {"answer": 42}

    barrier.wait()
    result = cache_aside_result(key, loader, ttl_s=30)
    # Each process asserts it missed: the key was cold when it looked.
    assert result.outcome in ("loaded", "waited"), result.outcome
    out.put((result.outcome, result.value))


def test_stampede_4_processes_released_together_one_loader_call() -> None:
    key = f"{unique('race')}:cold"
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(4)
    calls = context.Value("i", 0)
    out = context.Queue()
    connections.close_all()  # no database connection may be shared with the children
    processes = [context.Process(target=_process_reader, args=(key, barrier, calls, out)) for _ in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(20)
    assert [process.exitcode for process in processes] == [0, 0, 0, 0]
    results = [out.get(timeout=1) for _ in processes]
    assert calls.value == 1
    assert all(value == {"answer": 42} for _, value in results)
    assert sorted(outcome for outcome, _ in results) == ["loaded", "waited", "waited", "waited"]


class SlowReader:
    """A reader whose loader reads the database, then stalls until the test lets it finish."""

    def __init__(self, key: str, resource: str, *, fetch: Callable[..., CacheResult] = cache_aside_result):
        self.key = key
        self.resource = resource
        self.loaded = threading.Event()
        self.proceed = threading.Event()
        self.result: CacheResult | None = None
        self.thread = threading.Thread(target=self._run)
        self._fetch = fetch

    def _load(self) -> int:
        value = LockFence.objects.get(resource=self.resource).fence
        self.loaded.set()
        self.proceed.wait(10)
        return value

    def _run(self) -> None:
        try:
            self.result = self._fetch(self.key, self._load, ttl_s=60)
        finally:
            connections.close_all()

    def start(self) -> SlowReader:
        self.thread.start()
        assert self.loaded.wait(10)
        return self

    def finish(self) -> CacheResult:
        self.proceed.set()
        self.thread.join(10)
        assert self.result is not None
        return self.result


def write_version_2(key: str, how: str) -> None:
    """The writer: version 2 of the row committed with the key's (or its namespace's) invalidation."""
    with transaction.atomic():
        LockFence.objects.filter(resource=key).update(fence=2)
        if how == "key":
            invalidate(key)
        else:
            invalidate_namespace(key.split(":")[0])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["key", "namespace"])
def test_slow_reader_cannot_back_fill_the_old_value(how: str) -> None:
    key = f"{unique('race')}:1"
    LockFence.objects.create(resource=key, fence=1)  # "version 1" of the data
    engine = get_cache_aside()

    reader = SlowReader(key, key).start()  # has read version 1, not cached it yet
    write_version_2(key, how)
    result = reader.finish()  # now the slow reader tries to cache version 1

    assert result.value == 1 and result.outcome == "uncached"
    assert engine.peek(key) is None, "the old value was cached after the invalidation"
    assert cache_aside(key, lambda: LockFence.objects.get(resource=key).fence, ttl_s=60) == 2
    assert engine.peek(key) == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["key", "namespace"])
def test_a_read_that_begins_after_the_invalidation_does_not_join_a_rebuild_from_before_it(how: str) -> None:
    # In one process: a rebuild read version 1 and is still running when the write commits;
    # a request that starts after the write (say, the GET after a pay's 201) must see version 2,
    # not the older rebuild's value handed over by the in-process coalescing.
    key = f"{unique('race')}:1"
    LockFence.objects.create(resource=key, fence=1)
    reader = SlowReader(key, key).start()
    write_version_2(key, how)
    after = cache_aside_result(key, lambda: LockFence.objects.get(resource=key).fence, ttl_s=60)
    assert after.value == 2, f"a read begun after the write got the old value ({after.outcome})"
    assert reader.finish().value == 1  # the one that began before may see either


def _joined(key: str, count: int) -> None:
    """Wait until ``count`` callers of ``key``'s namespace wait on another thread's flight."""
    namespace = key.split(":")[0]
    wait_until(lambda: metric_value("composition_cache_coalesced_total", pattern=namespace) >= count, 10,
               interval_s=0.01, message=f"{count} readers never joined the flight of {key}")


def _fence_reader(key: str, out: list[CacheResult]) -> threading.Thread:
    def read() -> None:
        try:
            out.append(cache_aside_result(key, lambda: LockFence.objects.get(resource=key).fence, ttl_s=60))
        finally:
            connections.close_all()

    thread = threading.Thread(target=read)
    thread.start()
    return thread


def _another_process() -> CacheAside:
    """An engine on the same cache with flights of its own, as another process has."""
    return CacheAside("default", serializer=load_serializer(conf.CACHE_SERIALIZER), lease_ttl_s=5,
                      lease_wait_s=2, breaker_failures=3, breaker_reset_s=5)

def _write_and_invalidate(key: str, how: str, go: Any) -> None:
    """Another process's write: version 2 committed, then its invalidation applied."""
    assert go.wait(10)
    write_version_2(key, how)
    connections.close_all()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["key", "namespace"])
def test_a_read_after_another_process_s_write_does_not_join_a_rebuild_from_before_it(how: str) -> None:
    # The same across processes: the write (and its invalidation) happen in another process, as
    # when a pay is served by one web process and the GET after it by another, whose rebuild in
    # flight read version 1. That process never hears of the invalidation but through Redis.
    key = f"{unique('race')}:1"
    LockFence.objects.create(resource=key, fence=1)
    context = multiprocessing.get_context("fork")
    go = context.Event()
    connections.close_all()  # no database connection may be shared with the child
    writer = context.Process(target=_write_and_invalidate, args=(key, how, go))
    writer.start()
    try:
        reader = SlowReader(key, key).start()
        go.set()
        writer.join(20)
        assert writer.exitcode == 0
        # The read after the write, in this process, while the rebuild from before it still runs;
        # the rebuild ends well within the read's wait (CACHE_LEASE_WAIT_S, 2 s).
        after: list[CacheResult] = []
        later = _fence_reader(key, after)
        time.sleep(0.3)
        assert reader.finish().value == 1  # the one that began before may see either
        later.join(10)
        assert after[0].value == 2, f"a read after the other process's write got the old value ({after[0].outcome})"
        assert get_cache_aside().peek(key) == 2
    finally:
        go.set()
        writer.join(20)


@pytest.mark.django_db(transaction=True)
def test_invalidation_before_the_read_is_not_affected() -> None:
    # The other order: the write commits first, the reader loads afterwards and may cache.
    key = f"{unique('race')}:1"
    LockFence.objects.create(resource=key, fence=1)
    with transaction.atomic():
        LockFence.objects.filter(resource=key).update(fence=2)
        invalidate(key)
    reader = SlowReader(key, key).start()
    assert reader.finish().outcome == "loaded"
    assert get_cache_aside().peek(key) == 2



@pytest.mark.django_db(transaction=True)
def test_a_read_during_a_rebuild_under_its_lease_shares_it() -> None:
    # The load began before this reader, but under a lease that still stands: no write came
    # since, so the reader takes its value rather than loading again.
    key = f"{unique('race')}:1"
    LockFence.objects.create(resource=key, fence=1)
    reader = SlowReader(key, key).start()
    during: list[CacheResult] = []
    reading = _fence_reader(key, during)
    _joined(key, 1)
    assert reader.finish().outcome == "loaded"
    reading.join(10)
    assert (during[0].value, during[0].outcome) == (1, "coalesced")

@pytest.mark.django_db(transaction=True)
def test_a_read_after_a_write_does_not_take_the_old_entry_a_leader_found_before_it(monkeypatch: Any) -> None:
    # The leader's ACQUIRE found version 1, which another process had cached since the leader's
    # miss; then the write committed and its invalidation deleted that entry. A read that begins
    # after the write misses, and must not be handed the version 1 the leader found.
    key = f"{unique('race')}:1"
    LockFence.objects.create(resource=key, fence=1)
    engine = get_cache_aside()
    other_process = _another_process()  # which caches version 1 in the meantime
    found, proceed = threading.Event(), threading.Event()
    acquire = engine.store.acquire

    def acquire_then_stall(*args: Any, **kwargs: Any) -> Any:
        if found.is_set():
            return acquire(*args, **kwargs)
        other_process.fetch(key, lambda: LockFence.objects.get(resource=key).fence, ttl_s=60)
        answer = acquire(*args, **kwargs)
        found.set()
        assert proceed.wait(10)
        return answer

    monkeypatch.setattr(engine.store, "acquire", acquire_then_stall)
    leader: list[CacheResult] = []
    leading = _fence_reader(key, leader)
    assert found.wait(10)
    with transaction.atomic():  # the write, by the other process
        LockFence.objects.filter(resource=key).update(fence=2)
        other_process.invalidate(key)
    after: list[CacheResult] = []
    reading = _fence_reader(key, after)
    _joined(key, 1)
    proceed.set()
    leading.join(10)
    reading.join(10)
    assert (leader[0].value, leader[0].outcome) == (1, "hit")  # began before the write: either
    assert after[0].value == 2, f"a read begun after the write got the old value ({after[0].outcome})"
    assert engine.peek(key) == 2



@pytest.mark.django_db(transaction=True)
def test_a_read_after_a_write_does_not_take_the_stale_value_a_leader_served(monkeypatch: Any) -> None:
    # The leader looked up a stale version 1 and, another process holding the rebuild lease,
    # serves it. That value was read before the write that a reader who began later (and found
    # no entry) must see: that reader waits for the other process's version 2 instead.
    key = f"{unique('race')}:1"
    LockFence.objects.create(resource=key, fence=1)
    other_process = _another_process()
    assert cache_aside(key, lambda: 1, ttl_s=0.05, jitter=0, stale_ttl_s=60) == 1
    time.sleep(0.1)  # stale now
    stalled, proceed = threading.Event(), threading.Event()
    reading = Flight.reading

    def stall_the_leader(flight: Flight) -> None:
        if threading.current_thread().name == "leader" and not stalled.is_set():
            stalled.set()  # between its lookup and its ACQUIRE
            assert proceed.wait(10)
        reading(flight)

    monkeypatch.setattr(Flight, "reading", stall_the_leader)
    results: dict[str, CacheResult] = {}

    def read(name: str) -> None:
        try:
            results[name] = cache_aside_result(key, lambda: LockFence.objects.get(resource=key).fence, ttl_s=60,
                                               stale_ttl_s=60)
        finally:
            connections.close_all()

    leader = threading.Thread(target=read, args=("leader",), name="leader")
    leader.start()
    assert stalled.wait(10)
    with transaction.atomic():  # the write, by the other process
        LockFence.objects.filter(resource=key).update(fence=2)
        other_process.invalidate(key)
    after = threading.Thread(target=read, args=("after",))
    after.start()
    _joined(key, 1)
    rebuilding = SlowReader(key, key, fetch=other_process.fetch).start()  # holds the lease, has read 2
    proceed.set()
    leader.join(10)
    assert (results["leader"].value, results["leader"].outcome) == (1, "stale")  # began before the write
    assert rebuilding.finish().value == 2
    after.join(10)
    assert results["after"].value == 2, f"a read begun after the write got the old value ({results['after']})"


@pytest.mark.django_db(transaction=True)
def test_during_an_outage_a_read_after_a_write_does_not_join_a_load_from_before_it() -> None:
    # Redis is down, so every read loads from the database and no invalidation reaches a
    # flight. A load that read version 1 is still running when the write commits; a read that
    # begins after it must get version 2, not that load's value.
    key = f"{unique('out')}:1"
    LockFence.objects.create(resource=key, fence=1)
    with cache_at(f"redis://127.0.0.1:{free_port()}/0", CACHE_BREAKER_RESET_S=60):
        timed_calls(key, 3, "open the breaker")
        reader = SlowReader(key, key).start()
        write_version_2(key, "key")
        after: list[CacheResult] = []
        reading = _fence_reader(key, after)
        _joined(key, 1)
        assert reader.finish().value == 1
        reading.join(10)
    assert (after[0].value, after[0].outcome) == (2, "degraded"), after[0]


def _slow_count(calls: list[int], load_s: float) -> Callable[[], int]:
    def load() -> int:
        calls.append(1)
        time.sleep(load_s)
        return 7
    return load


def test_a_rebuild_slower_than_two_seconds_is_waited_for_not_repeated_by_every_caller() -> None:
    # With a 2 s wait, a loader slower than that (a database under load) had every waiting
    # caller, in this process and in others, run it too: 200 loads for 200 callers.
    key, calls = f"{unique('slow')}:1", []
    load = _slow_count(calls, 2.5)
    other = CacheAside("default", serializer=load_serializer(conf.CACHE_SERIALIZER),
                       lease_ttl_s=float(conf.CACHE_LEASE_TTL_S), lease_wait_s=float(conf.CACHE_LEASE_WAIT_S),
                       breaker_failures=3, breaker_reset_s=5)  # another process's engine
    outcomes: list[str] = []

    def read(engine: CacheAside) -> None:
        outcomes.append(engine.fetch(key, load, ttl_s=60).outcome)

    threads = [threading.Thread(target=read, args=(engine,))
               for engine in [get_cache_aside()] * 6 + [other] * 6]
    for thread in threads:
        thread.start()
        time.sleep(0.01)
    for thread in threads:
        thread.join(30)
    assert len(calls) == 1, f"{len(calls)} loads for {len(threads)} callers: {sorted(outcomes)}"
    assert sorted(set(outcomes)) == ["coalesced", "loaded", "waited"]
