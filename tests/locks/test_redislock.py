"""redis_lock against the real Redis: expiry and takeover, safe release, extend, fencing (also
across a Redis restart), mutual exclusion, and outages."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from prometheus_client import REGISTRY

from composition.conf import conf
from composition.errors import ConfigurationError
from composition.locks import (
    LockBackendUnavailable,
    LockLost,
    LockNotAcquired,
    StaleFence,
    acquire_redis_lock,
    fenced_write,
    redis_lock,
)
from composition.locks.models import LockFence
from composition.locks.redislock import _store
from composition.testing import ThrowawayRedis, free_port
from tests.helpers import elsewhere, unique

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def redis_at(url: str) -> Iterator[None]:
    caches = {"default": {**settings.CACHES["default"], "LOCATION": url}}
    with override_settings(CACHES=caches, COMPOSITION=conf.as_dict()):
        yield


def test_expired_lock_passes_to_b_and_a_late_release_and_write_change_nothing() -> None:
    name = f"{unique('rl')}:invoice-42"
    a = acquire_redis_lock(name, ttl_s=0.2)
    with pytest.raises(LockNotAcquired) as caught:
        acquire_redis_lock(name, ttl_s=5)
    assert caught.value.name == name
    time.sleep(0.3)  # A stalls past its TTL
    b = acquire_redis_lock(name, ttl_s=5)
    assert b.fence > a.fence

    assert a.release() is False
    store = _store()
    assert store.client.get(store.prefix + name) == b.token.encode(), "A's release removed B's lock"
    with pytest.raises(LockNotAcquired):
        acquire_redis_lock(name, ttl_s=5)

    with fenced_write(name, b.fence):
        LockFence.objects.create(resource=f"{name}/data", fence=b.fence)
    with pytest.raises(StaleFence) as stale, fenced_write(name, a.fence):
        pytest.fail("A's late write must not run")
    assert (stale.value.fence, stale.value.newest) == (a.fence, b.fence)
    assert b.release() is True
    # Refused before the transaction: a name over the column's 255 characters was PostgreSQL's
    # DataError, raised from inside the caller's atomic block.
    for resource in ("r" * 256, "", "a\x00b"):
        with pytest.raises(ValueError, match="fenced resource"), fenced_write(resource, b.fence):
            pytest.fail("refused before the block")


def test_django_s_own_redis_cache_is_refused_naming_the_backend_it_needs() -> None:
    # It was "AttributeError: 'RedisCache' object has no attribute 'client'".
    own = {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": settings.CACHES["default"]["LOCATION"]}
    with override_settings(CACHES={**settings.CACHES, "default": own}), \
            pytest.raises(ConfigurationError, match=r"redis_lock needs a django-redis cache: CACHES\['default'\]"
                                                    r"\['BACKEND'\] is 'django.core.cache.backends.redis.RedisCache"), \
            redis_lock(unique("own-cache"), ttl_s=5):
        pass


def test_context_manager_releases_also_when_the_body_raises() -> None:
    name = unique("rl")
    with pytest.raises(RuntimeError), redis_lock(name, ttl_s=5):
        raise RuntimeError("body failed")
    with redis_lock(name, ttl_s=5) as lock:
        assert lock.fence > 0


def test_taking_a_held_lock_again_in_its_block_says_so_at_once_and_other_threads_still_wait() -> None:
    # It waited on itself for wait_s, then said "busy" as if someone else held it.
    name = unique("rl")
    with redis_lock(name, ttl_s=5) as outer:
        for again in (lambda: redis_lock(name, ttl_s=5, wait_s=3).__enter__(),
                      lambda: acquire_redis_lock(name, ttl_s=5, wait_s=3)):
            started = time.monotonic()
            with pytest.raises(RuntimeError, match=r"held already by this thread.*not re-entrant"):
                again()
            assert time.monotonic() - started < 0.5
        with redis_lock(f"{name}-other", ttl_s=5):  # another name nests as before
            pass
        with pytest.raises(LockNotAcquired, match="busy"):  # another thread waits, as before
            elsewhere(lambda: acquire_redis_lock(name, ttl_s=5, wait_s=0.1))
        assert outer.fence > 0
    with redis_lock(name, ttl_s=5):  # released, and no longer counted as held
        pass


def test_blocks_ended_out_of_order_or_on_another_thread_release_their_locks_and_forget_them() -> None:
    # A generator's block can end out of order, or on another thread: the set of held names was
    # restored from a snapshot (leaving a released lock "held" for good), or its reset raised
    # before the release (the lock stayed taken until its TTL).
    first, second = unique("rl"), unique("rl")

    def holding(name: str) -> Iterator[None]:
        with redis_lock(name, ttl_s=30):
            yield

    a, b = holding(first), holding(second)
    next(a)
    next(b)
    a.close()
    b.close()
    with redis_lock(first, ttl_s=5), redis_lock(second, ttl_s=5):
        pass
    c = holding(first)
    next(c)
    elsewhere(c.close)  # ended on another thread
    with redis_lock(first, ttl_s=5):  # released, and no longer held by this thread
        pass


def test_extend_keeps_the_lock_and_fails_once_it_was_lost() -> None:
    name = unique("rl")
    with redis_lock(name, ttl_s=0.3) as lock:
        lock.extend(2)
        time.sleep(0.4)
        with pytest.raises(LockNotAcquired):
            elsewhere(lambda: acquire_redis_lock(name, ttl_s=1))
    lost = acquire_redis_lock(name, ttl_s=0.1)
    time.sleep(0.2)
    other = acquire_redis_lock(name, ttl_s=5)
    with pytest.raises(LockLost, match="lost: it expired while held") as raised:
        lost.extend(5)
    assert "not acquired" not in str(raised.value)  # it was held: its work may be half done
    assert other.release()


def test_wait_s_waits_for_the_holder() -> None:
    name = unique("rl")
    holder = acquire_redis_lock(name, ttl_s=5)
    threading.Timer(0.2, holder.release).start()
    started = time.monotonic()
    with pytest.raises(LockNotAcquired):
        acquire_redis_lock(name, ttl_s=5, wait_s=0)
    with redis_lock(name, ttl_s=5, wait_s=3):
        assert 0.15 <= time.monotonic() - started < 3


def test_mutual_exclusion_and_fences_follow_acquisition_order() -> None:
    name = unique("rl")
    inside = 0
    overlaps = 0
    fences: list[int] = []
    guard = threading.Lock()

    def worker() -> None:
        nonlocal inside, overlaps
        for _ in range(15):
            with redis_lock(name, ttl_s=5, wait_s=10) as lock:
                with guard:
                    inside += 1
                    overlaps += inside > 1
                    fences.append(lock.fence)
                time.sleep(0.001)
                with guard:
                    inside -= 1

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert overlaps == 0
    assert len(fences) == 90
    assert fences == sorted(fences) and len(set(fences)) == 90


def test_fences_keep_increasing_across_a_redis_restart_without_persistence(
        throwaway_redis_server: ThrowawayRedis) -> None:
    name = unique("rl")
    with redis_at(throwaway_redis_server.url):
        with redis_lock(name, ttl_s=5) as before:
            pass
        for _ in range(3):
            with redis_lock(name, ttl_s=5) as before:
                pass
        throwaway_redis_server.server.stop()   # no persistence: everything is gone
        throwaway_redis_server.server.start()
        assert _store().client.dbsize() == 0
        with redis_lock(name, ttl_s=5) as after:
            assert after.fence > before.fence
        with fenced_write(name, after.fence):
            pass
        with pytest.raises(StaleFence), fenced_write(name, before.fence):
            pass


def test_fences_keep_increasing_when_a_restart_restores_an_older_counter(
        throwaway_redis_server: ThrowawayRedis) -> None:
    # A crash restores what the last snapshot held (or what an AOF kept of its tail): the fence
    # hash comes back with a counter older than fences already handed out.
    name = unique("rl")
    with redis_at(throwaway_redis_server.url):
        with redis_lock(name, ttl_s=5):
            pass
        _store().client.save()
        issued = []
        for _ in range(3):
            with redis_lock(name, ttl_s=5) as lock:
                issued.append(lock.fence)
        with fenced_write(name, issued[-1]):
            pass
        os.kill(throwaway_redis_server.pid, signal.SIGKILL)
        throwaway_redis_server.restart()
        assert _store().client.exists(_store().fence_key), "the snapshot's fence hash is back"
        with redis_lock(name, ttl_s=5) as after:
            assert after.fence > max(issued)
        with fenced_write(name, after.fence):
            pass


def test_a_lock_that_expired_under_its_body_is_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    label = unique("rl")  # the metric's label: the name's namespace
    name = f"{label}:1"
    lost = REGISTRY.get_sample_value("composition_lock_lost_total", {"kind": "redis", "name": label}) or 0.0
    with redis_lock(name, ttl_s=0.2):
        time.sleep(0.3)
        elsewhere(lambda: acquire_redis_lock(name, ttl_s=5).release())  # another owner took it meanwhile
    assert REGISTRY.get_sample_value("composition_lock_lost_total", {"kind": "redis", "name": label}) == lost + 1
    assert "redis lock expired before its with-block ended" in caplog.text and name in caplog.text
    with redis_lock(name, ttl_s=5) as lock:
        lock.release()  # released by its body: nothing was lost
    assert REGISTRY.get_sample_value("composition_lock_lost_total", {"kind": "redis", "name": label}) == lost + 1


@pytest.mark.parametrize("outage", ["closed port", "frozen"])
def test_redis_down_raises_instead_of_proceeding(outage: str, throwaway_redis_server: ThrowawayRedis) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0" if outage == "closed port" else throwaway_redis_server.url
    if outage == "frozen":
        throwaway_redis_server.freeze()
    ran: list[Any] = []
    with redis_at(url):
        started = time.monotonic()
        with pytest.raises(LockNotAcquired) as caught, redis_lock("payments", ttl_s=5, wait_s=1):
            ran.append(True)
        elapsed = time.monotonic() - started
    assert isinstance(caught.value, LockBackendUnavailable)
    assert ran == []
    assert elapsed < 1.0  # bounded by the socket timeout, not by wait_s or a hang


def test_invalid_ttl() -> None:
    with pytest.raises(ValueError):
        acquire_redis_lock(unique("rl"), ttl_s=0)
    # 1e20 was taken for an unreachable lock store; nan and inf raised deep inside.
    for ttl_s in (1e20, float("inf"), float("nan"), -1):
        with pytest.raises(ValueError, match="ttl_s must be a number of seconds above 0 and at most"):
            acquire_redis_lock(unique("rl"), ttl_s=ttl_s)
    with pytest.raises(ValueError, match="wait_s must be a number of seconds from 0"):
        acquire_redis_lock(unique("rl"), ttl_s=5, wait_s=float("nan"))
    with pytest.raises(TypeError, match="a lock name is a non-empty string, got 42"):
        acquire_redis_lock(42, ttl_s=5)  # type: ignore[arg-type]


def test_extend_refuses_what_acquire_refuses() -> None:
    """extend(0) let the lock go within a millisecond while its holder still believed it held it."""
    name = unique("rl")
    with redis_lock(name, ttl_s=30) as lock:
        for ttl_s in (0, -10, float("nan"), 1e20):
            with pytest.raises(ValueError, match="ttl_s must be a number of seconds above 0"):
                lock.extend(ttl_s)
        time.sleep(0.05)
        with pytest.raises(LockNotAcquired):
            elsewhere(lambda: acquire_redis_lock(name, ttl_s=5))  # still held: nothing was shortened
