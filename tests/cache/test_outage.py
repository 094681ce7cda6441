"""cache_aside when Redis is unreachable: a closed port, a frozen server (SIGSTOP), a blackholed
connection, a process that dies right after an invalidation could not reach Redis, and a Redis
restarted from an older snapshot."""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import pytest
from django.conf import settings
from django.db import connections, transaction
from django.test import override_settings

from composition.cache import (
    CacheResult,
    InvalidationReplayComponent,
    cache_aside,
    cache_aside_result,
    get_cache_aside,
    invalidate,
    invalidate_namespace,
    pending_replay,
)
from composition.cache.models import PendingInvalidation
from composition.conf import conf
from composition.locks.models import LockFence
from composition.testing import (
    FaultProxy,
    ThrowawayRedis,
    current_database_url,
    fault_proxy,
    free_port,
    metric_value,
    subprocess_env,
    wait_until,
)
from tests.helpers import ROOT, unique


@contextmanager
def cache_at(url: str, **composition: Any) -> Iterator[None]:
    """Point the default cache (with the project's short socket timeouts) at ``url``."""
    caches = {"default": {**settings.CACHES["default"], "LOCATION": url}}
    with override_settings(CACHES=caches, COMPOSITION={**conf.as_dict(), **composition}):
        yield


def timed_calls(key: str, count: int, value: Any) -> tuple[list[Any], list[float]]:
    values, durations = [], []
    for _ in range(count):
        started = time.monotonic()
        values.append(cache_aside(key, lambda: value, ttl_s=30))
        durations.append(time.monotonic() - started)
    return values, durations


def _cached_then_frozen(server: ThrowawayRedis, cached: str, called: str) -> list[float]:
    """``cached`` holds "old"; then the server freezes and three calls for ``called`` fall back
    to the loader (each waiting out the socket timeout) and open the breaker; their durations."""
    assert cache_aside(cached, lambda: "old", ttl_s=60) == "old"
    server.freeze()
    values, durations = timed_calls(called, 3, "from-db")
    assert values == ["from-db"] * 3
    assert get_cache_aside().breaker.is_open
    return durations


@pytest.mark.django_db(transaction=True)
def test_closed_port_degrades_to_the_loader() -> None:
    ns = unique("out")
    key = f"{ns}:1"
    with cache_at(f"redis://127.0.0.1:{free_port()}/0", CACHE_BREAKER_RESET_S=60):
        engine = get_cache_aside()
        values, durations = timed_calls(key, 20, "from-db")
        assert values == ["from-db"] * 20
        assert engine.breaker.is_open
        assert statistics.median(durations[3:]) <= 0.1
        assert metric_value("composition_cache_errors_total", pattern=ns, reason="redis_error") == 3
        assert metric_value("composition_cache_errors_total", pattern=ns, reason="breaker_open") == 17
        with transaction.atomic():
            invalidate(key)
        assert PendingInvalidation.objects.filter(kind="key", target=key).count() == 1


@pytest.mark.django_db(transaction=True)
def test_frozen_redis_degrades_then_outage_invalidations_apply_after(
        throwaway_redis_server: ThrowawayRedis) -> None:
    ns = unique("out")
    key = f"{ns}:1"
    with cache_at(throwaway_redis_server.url, CACHE_BREAKER_RESET_S=0.3):
        engine = get_cache_aside()
        durations = _cached_then_frozen(throwaway_redis_server, key, key)
        assert min(durations) >= 0.2, "the frozen server should have cost a socket timeout"
        values, durations = timed_calls(key, 30, "from-db")  # breaker open
        assert values == ["from-db"] * 30
        assert statistics.median(durations) <= 0.1
        # One outlier is tolerated (a GC pause or a busy CI host); a second slow call would mean
        # calls wait on the frozen socket.
        assert sorted(durations)[-2] < 0.2, "no call may wait on the frozen socket once the breaker is open"
        assert metric_value("composition_cache_errors_total", pattern=ns, reason="redis_error") >= 3
        assert metric_value("composition_cache_errors_total", pattern=ns, reason="breaker_open") >= 30

        with transaction.atomic():  # a write during the outage
            invalidate(key)
        assert PendingInvalidation.objects.filter(target=key).count() == 1

        throwaway_redis_server.thaw()
        seen: list[Any] = []

        def recovered() -> bool:
            seen.append(cache_aside(key, lambda: "new", ttl_s=60))
            return not engine.breaker.is_open

        wait_until(recovered, 10, interval_s=0.05, message="breaker never closed after the thaw")
        assert cache_aside_result(key, lambda: "newer", ttl_s=60).value == "new"
        assert "old" not in seen, "the value invalidated during the outage was served after it"
        assert not PendingInvalidation.objects.filter(target=key).exists()


@pytest.mark.django_db(transaction=True)
def test_an_invalidation_refused_while_the_probe_ran_is_applied_when_it_closes(
        throwaway_redis_server: ThrowawayRedis) -> None:
    # The interleaving the probe cannot see: its replay has read the pending rows, then a
    # writer commits and its after-commit hook, refused by the half-open breaker, leaves its row;
    # then the probe closes the breaker. That row must not wait for the periodic replay (a
    # web-only deployment runs none) while the old entry is served as a hit.
    ns = unique("out")
    key = f"{ns}:1"
    with cache_at(throwaway_redis_server.url, CACHE_BREAKER_RESET_S=0.3):
        engine = get_cache_aside()
        _cached_then_frozen(throwaway_redis_server, key, f"{ns}:other")
        throwaway_redis_server.thaw()
        recover = engine.breaker._probe

        def probe_then_a_refused_commit() -> None:
            recover()  # its replay found nothing pending
            with transaction.atomic():  # committed while the breaker is still half-open
                invalidate(key)

        engine.breaker._probe = probe_then_a_refused_commit
        wait_until(lambda: cache_aside(f"{ns}:other", lambda: 1, ttl_s=60) is not None
                   and not engine.breaker.is_open, 10, interval_s=0.05, message="breaker never closed")
        wait_until(lambda: not PendingInvalidation.objects.filter(target=key).exists(), 5,
                   message="the refused invalidation stayed pending after the breaker closed")
        assert cache_aside(key, lambda: "new", ttl_s=60) == "new"


@pytest.mark.django_db(transaction=True)
def test_during_an_outage_readers_share_one_load_per_process() -> None:
    # Sixteen readers of one key with Redis down: the first loads; the fifteen that ask while
    # that load runs share one more load (the first began before them, so a write committed in
    # between may be missing from it), not one each, though waiting for both loads takes longer
    # than CACHE_LEASE_WAIT_S: each wait is for one load.
    key = f"{unique('out')}:1"
    calls = 0
    first_began = threading.Event()

    def loader() -> str:
        nonlocal calls
        calls += 1
        first_began.set()
        time.sleep(0.7)
        return f"v{calls}"

    with cache_at(f"redis://127.0.0.1:{free_port()}/0", CACHE_BREAKER_RESET_S=60, CACHE_LEASE_WAIT_S=1.0):
        timed_calls(key, 3, "open the breaker")
        results: list[str] = []

        def reader() -> None:
            results.append(cache_aside(key, loader, ttl_s=30))

        threads = [threading.Thread(target=reader)]
        threads[0].start()
        assert first_began.wait(10)
        threads += [threading.Thread(target=reader) for _ in range(15)]
        for thread in threads[1:]:
            thread.start()
        for thread in threads:
            thread.join(10)
    assert sorted(results) == ["v1"] + ["v2"] * 15
    assert calls == 2


# The child writes, invalidates while Redis is unreachable, and is SIGKILLed right after commit.
# The invalidation is recorded inside the writer's transaction either way; with "open" its breaker
# is already open, so the after-commit step does not try Redis; with "closed" it tries and fails.
# (A child killed after COMMIT while Redis is fine: tests/cache/test_invalidation.py.)
CHILD = """
import os, signal, sys
import django
django.setup()
from django.db import connections, transaction
from composition.cache import cache_aside, invalidate, get_cache_aside
from composition.locks.models import LockFence

key, breaker = sys.argv[1], sys.argv[2]
if breaker == "open":
    for _ in range(5):
        cache_aside(key, lambda: None, ttl_s=30)
    assert get_cache_aside().breaker.is_open
with transaction.atomic():
    LockFence.objects.filter(resource=key).update(fence=2)
    invalidate(key)
print("committed", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("breaker", ["open", "closed"])
def test_invalidation_survives_the_death_of_the_process_that_deferred_it(breaker: str) -> None:
    key = f"{unique('out')}:1"
    LockFence.objects.create(resource=key, fence=1)
    engine = get_cache_aside()  # this process reaches Redis fine
    assert cache_aside(key, lambda: LockFence.objects.get(resource=key).fence, ttl_s=60) == 1

    # The child cannot reach Redis (a network partition, say): a closed port.
    env = subprocess_env(REDIS_URL=f"redis://127.0.0.1:{free_port()}/3")
    child = subprocess.run([sys.executable, "-c", CHILD, key, breaker], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == -9, child.stderr
    assert "committed" in child.stdout
    assert LockFence.objects.get(resource=key).fence == 2
    assert PendingInvalidation.objects.filter(kind="key", target=key).count() == 1
    assert engine.peek(key) == 1, "the stale value is still cached: nothing reached Redis"

    replayer = InvalidationReplayComponent(interval_s=0.05)
    replayer.start()
    try:
        wait_until(lambda: engine.peek(key) is None, 10, message="deferred invalidation never replayed")
    finally:
        replayer.stop(5)
    assert cache_aside(key, lambda: LockFence.objects.get(resource=key).fence, ttl_s=60) == 2
    assert not PendingInvalidation.objects.filter(target=key).exists()



@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["key", "namespace"])
def test_a_redis_restarted_from_an_older_snapshot_serves_nothing_cached_before_it(
        how: str, throwaway_redis_server: ThrowawayRedis) -> None:
    """The snapshot holds an entry whose invalidation Redis applied after it (the durable row is
    gone by then): once the restarted server answers, the entry is a miss within
    ``EPOCH_CHECK_S``, not the old value until its TTL."""
    from composition.cache.epoch import EPOCH_CHECK_S

    ns = unique("snap")
    key = f"{ns}:1"
    database = {"value": "v1"}
    with cache_at(throwaway_redis_server.url, CACHE_BREAKER_RESET_S=0.3):
        engine = get_cache_aside()
        assert cache_aside_result(key, lambda: database["value"], ttl_s=300).outcome == "loaded"
        engine.client.save()  # the snapshot: the entry holds v1
        with transaction.atomic():
            database["value"] = "v2"
            if how == "key":
                invalidate(key)
            else:
                invalidate_namespace(ns)
        assert not PendingInvalidation.objects.exists() and engine.peek(key) is None
        throwaway_redis_server.restart()  # back from the snapshot
        assert engine.peek(key) == "v1", "the restarted server holds the old entry (the test's premise)"

        served: list[Any] = []

        def read_through_redis() -> bool:
            served.append(cache_aside_result(key, lambda: database["value"], ttl_s=300))
            return served[-1].outcome not in ("degraded", "uncached")

        wait_until(read_through_redis, 10, interval_s=0.05, message="the cache never used Redis again")
        time.sleep(EPOCH_CHECK_S)
        served.append(cache_aside_result(key, lambda: database["value"], ttl_s=300))
        assert served[-1].value == "v2", f"{served[-1].outcome} {served[-1].value!r} after the restart"
        assert engine.peek(key) == "v2"


@pytest.mark.django_db(transaction=True)
def test_the_epoch_key_lost_on_the_same_server_comes_back_and_clients_refused_info_do_not_replace_it(
        throwaway_redis_server: ThrowawayRedis) -> None:
    """Two ways a new epoch would turn the whole cache into misses for nothing: its key evicted or
    deleted while the server runs on, and clients that differ on whether INFO is allowed taking
    turns to replace each other's epoch."""
    import redis

    from composition.cache.store import LeaseStore

    key = f"{unique('epoch')}:1"
    with cache_at(throwaway_redis_server.url):
        engine = get_cache_aside()
        assert cache_aside_result(key, lambda: "v1", ttl_s=300).outcome == "loaded"
        engine.client.delete(engine.keys.epoch)  # evicted, say
        engine.epoch.recheck()
        assert cache_aside_result(key, lambda: "v2", ttl_s=300).outcome == "hit"

        admin = redis.Redis.from_url(throwaway_redis_server.url)
        admin.execute_command("ACL", "SETUSER", "noinfo", "on", ">secret", "~*", "&*", "+@all", "-info")
        limited = redis.Redis(host=admin.connection_pool.connection_kwargs["host"],
                              port=admin.connection_pool.connection_kwargs["port"], username="noinfo",
                              password="secret")
        stores = [LeaseStore(engine.client), LeaseStore(limited)]
        installs, last = 0, b""
        for turn in range(10):
            installed, last = stores[turn % 2].ensure_epoch(engine.keys.epoch, f"t{turn}", last)
            installs += installed
        assert installs == 0, f"{installs} new epochs in 10 checks"
        assert cache_aside_result(key, lambda: "v3", ttl_s=300).outcome == "hit"


@pytest.mark.django_db(transaction=True)
def test_a_process_whose_invalidation_failed_after_commit_never_serves_its_own_write_stale(
        throwaway_redis_server: ThrowawayRedis) -> None:
    # One Redis timeout right after COMMIT left the row for the periodic replay (runworkers, every
    # CACHE_REPLAY_INTERVAL_S), and the breaker closed: until then, this very process kept
    # serving the value its own committed write had replaced.
    key = f"{unique('blip')}:1"
    LockFence.objects.create(resource=key, fence=1)

    def load() -> int:
        return LockFence.objects.get(resource=key).fence

    with cache_at(throwaway_redis_server.url):
        assert cache_aside_result(key, load, ttl_s=300) == (1, "loaded")
        with transaction.atomic():
            transaction.on_commit(throwaway_redis_server.freeze)  # runs before the invalidation's
            LockFence.objects.filter(resource=key).update(fence=2)
            invalidate(key)
            transaction.on_commit(throwaway_redis_server.thaw)  # and this one after it
        assert PendingInvalidation.objects.filter(target=key).exists(), "the apply did not fail"
        assert not get_cache_aside().breaker.is_open
        assert cache_aside_result(key, load, ttl_s=300) == (2, "loaded"), "its own write served stale"
        assert not PendingInvalidation.objects.filter(target=key).exists()  # the read replayed it first
        assert cache_aside_result(key, load, ttl_s=300) == (2, "hit")


def _fence(key: str) -> int:
    return LockFence.objects.get(resource=key).fence


@contextmanager
def redis_behind(server: ThrowawayRedis) -> Iterator[FaultProxy]:
    """The default cache on ``server`` through a fault proxy. A blackhole, unlike a frozen server,
    drops a command for good: a frozen server still runs the ones it received once thawed."""
    with fault_proxy("127.0.0.1", server.port) as proxy, cache_at(proxy.proxied_url(server.url)):
        yield proxy


def _commit_version_2_unreachable(proxy: FaultProxy, key: str, *also_invalidated: str) -> None:
    """Commit fence 2 for ``key`` with its invalidation (and ``also_invalidated``'s): Redis
    becomes unreachable right before the after-commit delete, which fails, and stays so."""
    with transaction.atomic():
        transaction.on_commit(proxy.blackhole)  # runs before the invalidation's
        LockFence.objects.filter(resource=key).update(fence=2)
        for invalidated in (key, *also_invalidated):
            invalidate(invalidated)
    assert PendingInvalidation.objects.filter(target=key).exists(), "the apply did not fail"


@pytest.mark.django_db(transaction=True)
def test_a_catch_up_that_skips_a_row_another_replayer_holds_does_not_take_its_key_for_applied(
        throwaway_redis_server: ThrowawayRedis) -> None:
    # The read's catch-up skipped (SKIP LOCKED) the row another process's replayer held, returned
    # normally, and took the key for applied: the old entry was served as a hit, and kept being
    # served after that replayer rolled back.
    import psycopg

    key = f"{unique('held')}:1"
    LockFence.objects.create(resource=key, fence=1)
    with redis_behind(throwaway_redis_server) as proxy:
        assert cache_aside_result(key, partial(_fence, key), ttl_s=300) == (1, "loaded")
        _commit_version_2_unreachable(proxy, key)
        proxy.pass_through()
        row = PendingInvalidation.objects.get(target=key)
        with psycopg.connect(current_database_url()) as replayer:  # another process's, mid-replay
            replayer.execute(f"SELECT id FROM {PendingInvalidation._meta.db_table} WHERE id = %s FOR UPDATE",
                             [row.pk])
            assert cache_aside_result(key, partial(_fence, key), ttl_s=300) == (2, "degraded")
            replayer.rollback()  # it failed: the row is this process's to replay again
        served: list[CacheResult] = []

        def replayed() -> bool:
            served.append(cache_aside_result(key, partial(_fence, key), ttl_s=300))
            return served[-1].outcome == "loaded"

        wait_until(replayed, 10, message="the catch-up never replayed the row once it was free")
        assert {value for value, _ in served} == {2}, f"its own write served stale: {served}"
        assert not PendingInvalidation.objects.filter(target=key).exists()
        assert cache_aside_result(key, partial(_fence, key), ttl_s=300) == (2, "hit")


def _stalled_rebuild(key: str, out: list[CacheResult], read: threading.Event,
                     proceed: threading.Event) -> threading.Thread:
    """A rebuild of ``key`` that reads the fence under its lease, sets ``read`` and waits for
    ``proceed`` before it fills; its result goes to ``out``."""
    def load() -> int:
        fence = _fence(key)
        read.set()
        assert proceed.wait(10)
        return fence

    return _reader(key, out, load)


def _reader(key: str, out: list[CacheResult], loader: Callable[[], Any] | None = None,
            name: str | None = None) -> threading.Thread:
    def run() -> None:
        try:
            out.append(cache_aside_result(key, loader or partial(_fence, key), ttl_s=300))
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread


def _catch_up_fails_then_redis_answers(proxy: FaultProxy, other: str) -> None:
    """A read of ``other`` (invalidated by the same failed commit) tries the catch-up while Redis
    is unreachable, which fails and holds the next one off; then Redis answers again."""
    assert cache_aside_result(other, partial(_fence, other), ttl_s=300) == (1, "degraded")
    assert PendingInvalidation.objects.filter(target=other).exists(), "the catch-up did not fail"
    proxy.pass_through()
    assert not get_cache_aside().breaker.is_open


def _two_keys_at_fence_1(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, str]:
    """A namespace and two keys of it whose fences are 1; a failed catch-up holds off the next
    for the whole test (CATCH_UP_INTERVAL_S)."""
    ns = unique("joined")
    key, other = f"{ns}:1", f"{ns}:2"
    LockFence.objects.bulk_create([LockFence(resource=key, fence=1), LockFence(resource=other, fence=1)])
    monkeypatch.setattr(pending_replay, "CATCH_UP_INTERVAL_S", 60.0)
    return ns, key, other


@pytest.mark.django_db(transaction=True)
def test_a_read_after_its_own_failed_invalidation_does_not_join_the_rebuild_from_before_it(
        throwaway_redis_server: ThrowawayRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    # A rebuild under a lease had read fence 1 when this process's write committed and its delete
    # failed: the lease stood in Redis, so a read after the write, its catch-up held off, joined
    # that rebuild and was handed fence 1 ("coalesced").
    ns, key, other = _two_keys_at_fence_1(monkeypatch)
    read, proceed = threading.Event(), threading.Event()
    with redis_behind(throwaway_redis_server) as proxy:
        before: list[CacheResult] = []
        rebuild = _stalled_rebuild(key, before, read, proceed)
        try:
            assert read.wait(10)
            _commit_version_2_unreachable(proxy, key, other)
            _catch_up_fails_then_redis_answers(proxy, other)
            after: list[CacheResult] = []
            reading = _reader(key, after)
            wait_until(lambda: after or metric_value("composition_cache_coalesced_total", pattern=ns) >= 1, 10,
                       message="the read after the write neither returned nor waited")
        finally:
            proceed.set()
            rebuild.join(10)
        reading.join(10)
        assert before[0].value == 1  # began before the write: either
        assert after[0].value == 2, f"its own write served stale ({after[0].outcome})"


@pytest.mark.django_db(transaction=True)
def test_a_read_after_its_own_failed_invalidation_does_not_join_a_rebuild_that_finds_the_old_entry(
        throwaway_redis_server: ThrowawayRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    # Detaching the rebuild from before the write is not enough: a read that raced the write (its
    # look at the unapplied keys came before) rebuilds anew, waits on the old rebuild's lease, which
    # no delete revoked, and then finds the entry that rebuild filled with fence 1. A read after
    # the write that joined it took fence 1, read "after" it began.
    ns, key, other = _two_keys_at_fence_1(monkeypatch)
    read, proceed = threading.Event(), threading.Event()
    racing_arrived, racing_go = threading.Event(), threading.Event()
    with redis_behind(throwaway_redis_server) as proxy:
        engine = get_cache_aside()
        execute = engine._execute

        def racing_lookup(*args: Any) -> Any:
            # Only the racing read's lookup stalls (mock.patch to force this one race).
            if threading.current_thread().name == "racing":
                racing_arrived.set()
                assert racing_go.wait(10)
            return execute(*args)

        monkeypatch.setattr(engine, "_execute", racing_lookup)
        before: list[CacheResult] = []
        rebuild = _stalled_rebuild(key, before, read, proceed)
        racing: list[CacheResult] = []
        try:
            assert read.wait(10)
            racing_read = _reader(key, racing, name="racing")
            assert racing_arrived.wait(10)
            _commit_version_2_unreachable(proxy, key, other)
            _catch_up_fails_then_redis_answers(proxy, other)
            racing_go.set()

            def waits() -> float:
                return (metric_value("composition_cache_coalesced_total", pattern=ns)
                        + metric_value("composition_cache_lease_rejections_total", pattern=ns, stage="acquire"))

            wait_until(lambda: waits() >= 1, 10, message="the racing read never waited")
            waited = waits()
            after: list[CacheResult] = []
            reading = _reader(key, after)
            wait_until(lambda: after or waits() > waited, 10,
                       message="the read after the write neither returned nor waited")
        finally:
            racing_go.set()
            proceed.set()
            rebuild.join(10)
        racing_read.join(10)
        reading.join(10)
        assert before[0].value == 1 and racing[0].value == 1  # both began before the write: either
        assert after[0].value == 2, f"its own write served stale ({after[0].outcome})"
