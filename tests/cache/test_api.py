"""cache_aside and invalidate against the real Redis: hits, misses, namespaces, transactions,
stale serving, early refresh, serializers and metrics."""

from __future__ import annotations

import threading
import time
from decimal import Decimal
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import transaction
from django.test import override_settings

from composition.cache import (
    CacheConfigurationError,
    cache_aside,
    cache_aside_result,
    get_cache_aside,
    invalidate,
    invalidate_namespace,
)
from composition.conf import conf
from composition.testing import free_port, metric_value
from tests.helpers import unique


class Source:
    """A loader that counts its calls and returns the current value of a mutable source."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.value


def test_miss_then_hit_one_loader_call() -> None:
    key = f"{unique()}:1"
    source = Source({"id": 1, "total": "9.50"})
    first = cache_aside_result(key, source, ttl_s=30)
    second = cache_aside_result(key, source, ttl_s=30)
    assert (first.outcome, second.outcome) == ("loaded", "hit")
    assert first.value == second.value == {"id": 1, "total": "9.50"}
    assert source.calls == 1


def test_every_path_returns_the_serialized_form() -> None:
    # JSON by default: the caller that loaded gets what a later hit gets, not the raw object.
    key = f"{unique()}:1"
    loaded = cache_aside(key, lambda: {"amount": Decimal("1.10"), "ids": (1, 2)}, ttl_s=30)
    hit = cache_aside(key, lambda: None, ttl_s=30)
    assert loaded == hit == {"amount": "1.10", "ids": [1, 2]}


def test_returned_values_are_independent_copies() -> None:
    key = f"{unique()}:1"
    cache_aside(key, lambda: {"items": [1]}, ttl_s=30)["items"].append(2)
    assert cache_aside(key, lambda: None, ttl_s=30) == {"items": [1]}


def test_ttl_expires_and_jitter_only_shortens_it() -> None:
    ns = unique()
    engine = get_cache_aside()
    began = time.monotonic()
    for i in range(20):
        cache_aside(f"{ns}:{i}", lambda: 1, ttl_s=10, jitter=0.5)
    ttls = [engine.client.pttl(engine.keys.entry(f"{ns}:{i}")) for i in range(20)]
    # At least half the TTL, less the time the writes and reads took (a loaded gate once took
    # 118 ms of it, past a fixed 100 ms allowance).
    taken_ms = (time.monotonic() - began) * 1000
    assert all(5_000 - taken_ms - 1 <= ttl <= 10_000 for ttl in ttls), (ttls, taken_ms)
    assert len(set(ttls)) > 5, "jitter should spread the expiries"
    key = f"{ns}:short"
    source = Source("v")
    cache_aside(key, source, ttl_s=0.1, jitter=0)
    time.sleep(0.15)
    assert cache_aside_result(key, source, ttl_s=0.1, jitter=0).outcome == "loaded"
    assert source.calls == 2


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        cache_aside("k:1", lambda: 1, ttl_s=0)
    with pytest.raises(ValueError):
        cache_aside("k:1", lambda: 1, ttl_s=1, jitter=1)
    # Each was taken for a Redis outage (served degraded, every time), or raised deep inside.
    loaded = []
    for ttl_s, stale_ttl_s, says in ((1e20, None, "ttl_s must be a number of seconds above 0 and at most"),
                                     (float("inf"), None, "ttl_s must be"), (float("nan"), None, "ttl_s must be"),
                                     (30, float("nan"), "stale_ttl_s must be a number of seconds from 0")):
        with pytest.raises(ValueError, match=says):
            cache_aside("k:1", lambda: loaded.append(1), ttl_s=ttl_s, stale_ttl_s=stale_ttl_s)
        with pytest.raises(ValueError, match=says):
            get_cache_aside().fetch("k:1", lambda: loaded.append(1), ttl_s=ttl_s, stale_ttl_s=stale_ttl_s)
    assert loaded == []  # refused before any load
    with pytest.raises(TypeError, match="a cache key is a non-empty string, got 42"):
        cache_aside(42, lambda: 1, ttl_s=30)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a cache key is a non-empty string"):
        invalidate(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="without ':'"):
        invalidate_namespace("a:b")  # a namespace is the text before a key's first ':': it matches nothing
    # Cached fine, then its invalidation's row was refused by PostgreSQL (text holds no NUL).
    for call in (lambda: cache_aside("k:a\x00b", lambda: 1, ttl_s=30), lambda: invalidate("k:a\x00b")):
        with pytest.raises(ValueError, match="NUL"):
            call()
    # A lone surrogate raised UnicodeEncodeError from the INSERT (or from the on_commit apply).
    for call in (lambda: cache_aside("k:\ud800", lambda: loaded.append(1), ttl_s=30),
                 lambda: invalidate("k:\ud800"), lambda: invalidate_namespace("\ud800")):
        with pytest.raises(ValueError, match="lone surrogate"):
            call()
    # Its namespace would be "", which invalidate_namespace() refuses: such a key could not be.
    with pytest.raises(ValueError, match=r"namespace .* cannot be empty"):
        cache_aside(":x", lambda: loaded.append(1), ttl_s=30)
    assert loaded == []


def test_a_bad_early_refresh_is_refused_on_the_first_call_not_on_the_first_hit() -> None:
    # Only a hit read it: a cold cache loaded fine, then every read of the warm one raised TypeError.
    key = f"{unique()}:1"
    loaded = []
    for bad in (None, "1", True, float("nan"), float("inf"), -1):
        with pytest.raises(ValueError, match="early_refresh is a finite number >= 0"):
            cache_aside(key, lambda: loaded.append(1), ttl_s=30, early_refresh=bad)  # type: ignore[arg-type]
    assert loaded == []
    assert cache_aside_result(key, lambda: 1, ttl_s=30, early_refresh=0).outcome == "loaded"
    assert cache_aside_result(key, lambda: 1, ttl_s=30, early_refresh=1.0).outcome in ("hit", "loaded")


def test_an_overlong_key_is_refused_and_never_counted_as_an_outage() -> None:
    # A 40 MB key timed out at Redis and was counted against every key by the breaker.
    ns = unique()
    engine = get_cache_aside()
    loaded = []
    for call in (lambda: cache_aside(f"{ns}:" + "x" * 5000, lambda: loaded.append(1), ttl_s=30),
                 lambda: invalidate(f"{ns}:" + "x" * 5000), lambda: invalidate_namespace("x" * 5000)):
        with pytest.raises(ValueError, match="at most 4096 characters") as refused:
            call()
        assert len(str(refused.value)) < 400, "the message quotes the whole key"
    assert loaded == []
    assert engine.breaker.state == "closed"
    key = f"{ns}:" + "x" * (4096 - len(ns) - 1)
    assert cache_aside_result(key, lambda: 1, ttl_s=30).outcome == "loaded"
    assert cache_aside_result(key, lambda: 2, ttl_s=30).outcome == "hit"


def test_a_lease_shorter_than_a_millisecond_is_not_taken_for_a_redis_outage() -> None:
    # PX 0 was refused by Redis on every miss: each was served "degraded" and counted as a Redis
    # failure. Now the lease is 1 ms: a rebuild within it is cached, a slower one is not (as any
    # rebuild that outlives its lease), and Redis is never blamed.
    with override_settings(COMPOSITION={**conf.as_dict(), "CACHE_LEASE_TTL_S": 0.0005}):
        engine = get_cache_aside()
        outcomes = {cache_aside_result(f"{unique()}:1", lambda: 1, ttl_s=30).outcome for _ in range(5)}
        assert outcomes <= {"loaded", "uncached"}, outcomes
        assert engine.breaker.state == "closed"


@pytest.mark.django_db(transaction=True)
def test_invalidate_waits_for_commit_and_is_dropped_on_rollback() -> None:
    key = f"{unique()}:1"
    engine = get_cache_aside()
    cache_aside(key, lambda: "old", ttl_s=30)
    with pytest.raises(RuntimeError), transaction.atomic():
        invalidate(key)
        raise RuntimeError("the write failed")
    assert engine.peek(key) == "old"
    with transaction.atomic():
        invalidate(key)
        assert engine.peek(key) == "old", "deleted before the write committed"
    assert engine.peek(key) is None
    assert cache_aside(key, lambda: "new", ttl_s=30) == "new"


@pytest.mark.django_db(transaction=True)
def test_invalidate_outside_a_transaction_is_immediate() -> None:
    key = f"{unique()}:1"
    cache_aside(key, lambda: "old", ttl_s=30)
    invalidate(key)
    assert get_cache_aside().peek(key) is None


@pytest.mark.django_db(transaction=True)
def test_namespace_invalidation_drops_every_key_with_one_call() -> None:
    ns, other = unique(), unique()
    for i in range(5):
        cache_aside(f"{ns}:{i}", lambda: "old", ttl_s=30)
    cache_aside(f"{other}:1", lambda: "kept", ttl_s=30)
    invalidate_namespace(ns)
    assert [cache_aside(f"{ns}:{i}", lambda: "new", ttl_s=30) for i in range(5)] == ["new"] * 5
    assert cache_aside(f"{other}:1", lambda: "other", ttl_s=30) == "kept"


def test_stale_value_served_while_another_caller_rebuilds() -> None:
    key = f"{unique()}:1"
    cache_aside(key, lambda: "v1", ttl_s=0.1, jitter=0, stale_ttl_s=30)
    time.sleep(0.15)
    started, release = threading.Event(), threading.Event()

    def slow_rebuild() -> str:
        started.set()
        release.wait(5)
        return "v2"

    results: list[Any] = []
    rebuilder = threading.Thread(target=lambda: results.append(
        cache_aside_result(key, slow_rebuild, ttl_s=30, jitter=0, stale_ttl_s=30)))
    rebuilder.start()
    assert started.wait(5)
    before = metric_value("composition_cache_stale_served_total", pattern=key.split(":")[0])
    t0 = time.monotonic()
    stale = cache_aside_result(key, lambda: pytest.fail("must not load"), ttl_s=30, stale_ttl_s=30)
    assert stale.value == "v1" and stale.outcome == "stale"
    assert time.monotonic() - t0 < 1.0, "a stale read must not wait for the rebuild"
    assert metric_value("composition_cache_stale_served_total", pattern=key.split(":")[0]) == before + 1
    release.set()
    rebuilder.join(5)
    assert results[0].value == "v2"
    assert cache_aside(key, lambda: "v3", ttl_s=30) == "v2"


def test_without_stale_ttl_an_expired_value_is_never_served() -> None:
    key = f"{unique()}:1"
    cache_aside(key, lambda: "v1", ttl_s=0.1, jitter=0)
    time.sleep(0.15)
    assert cache_aside(key, lambda: "v2", ttl_s=30) == "v2"


def test_early_refresh_rebuilds_before_expiry() -> None:
    # XFetch with a large beta and a slow rebuild: refreshes well before the TTL runs out.
    key = f"{unique()}:1"
    cache_aside(key, lambda: time.sleep(0.05) or "v1", ttl_s=1, jitter=0)
    outcomes = []
    deadline = time.monotonic() + 0.9
    while time.monotonic() < deadline:
        outcomes.append(cache_aside_result(key, lambda: "v2", ttl_s=1, jitter=0, early_refresh=50).outcome)
        if outcomes[-1] == "loaded":
            break
        time.sleep(0.01)
    assert outcomes[-1] == "loaded", outcomes
    # Without early refresh the same key is served from cache until it expires.
    other = f"{unique()}:1"
    cache_aside(other, lambda: time.sleep(0.05) or "v1", ttl_s=5, jitter=0)
    assert {cache_aside_result(other, lambda: "v2", ttl_s=5).outcome for _ in range(50)} == {"hit"}


def test_loader_error_propagates_and_gives_the_lease_back() -> None:
    key = f"{unique()}:1"

    def broken() -> None:
        raise LookupError("database says no")

    with pytest.raises(LookupError):
        cache_aside(key, broken, ttl_s=30)
    engine = get_cache_aside()
    assert engine.client.get(engine.keys.lease(key)) is None
    assert cache_aside_result(key, lambda: "ok", ttl_s=30).outcome == "loaded"


def test_unserializable_value_raises_type_error() -> None:
    with pytest.raises(TypeError):
        cache_aside(f"{unique()}:1", lambda: object(), ttl_s=30)


def test_metrics_are_labelled_by_pattern() -> None:
    ns = unique()
    pattern = f"{ns}:<id>"
    before = {n: metric_value(f"composition_cache_{n}_total", pattern=pattern) for n in ("hits", "misses")}
    for i in range(3):
        cache_aside(f"{ns}:{i}", lambda: 1, ttl_s=30, pattern=pattern)
        cache_aside(f"{ns}:{i}", lambda: 1, ttl_s=30, pattern=pattern)
    assert metric_value("composition_cache_hits_total", pattern=pattern) == before["hits"] + 3
    assert metric_value("composition_cache_misses_total", pattern=pattern) == before["misses"] + 3
    assert metric_value("composition_cache_rebuild_seconds_count", pattern=pattern) == 3
    # Without a pattern the label is the namespace, never the full key.
    cache_aside(f"{ns}:99", lambda: 1, ttl_s=30)
    assert metric_value("composition_cache_misses_total", pattern=ns) == 1
    # A key without a namespace counts under one label, not a label per key (f"user-{id}").
    before_none = metric_value("composition_cache_misses_total", pattern="(none)")
    for i in range(3):
        cache_aside(f"{ns}-{i}", lambda: 1, ttl_s=30)
    assert metric_value("composition_cache_misses_total", pattern="(none)") == before_none + 3
    assert metric_value("composition_cache_misses_total", pattern=f"{ns}-0") == 0


class PickyReprSerializer:
    """A custom serializer, to show the setting is honoured."""

    def dumps(self, value: Any) -> bytes:
        return repr(value).encode()

    def loads(self, data: bytes) -> Any:
        return f"decoded:{data.decode()}"


def test_a_rebuild_that_outlasts_its_lease_is_not_cached_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    key = f"{unique()}:slow"
    calls = []

    def slow_loader() -> int:
        calls.append(1)
        time.sleep(0.4)
        return 1

    with override_settings(COMPOSITION={**conf.as_dict(), "CACHE_LEASE_TTL_S": 0.3}):
        outcomes = [cache_aside_result(key, slow_loader, ttl_s=30).outcome for _ in range(2)]
    assert outcomes == ["uncached", "uncached"] and len(calls) == 2, "each caller ran the loader again"
    warnings = [line for line in caplog.text.splitlines() if "cache rebuild outlasted its lease" in line]
    assert len(warnings) == 2 and key in warnings[0] and "CACHE_LEASE_TTL_S" in warnings[0]


def test_serializer_is_configurable() -> None:
    composition = {**conf.as_dict(), "CACHE_SERIALIZER": f"{__name__}.PickyReprSerializer"}
    with override_settings(COMPOSITION=composition):
        assert cache_aside(f"{unique()}:1", lambda: 7, ttl_s=30) == "decoded:7"


def test_an_entry_this_serializer_cannot_read_is_loaded_from_the_database_and_replaced() -> None:
    # CACHE_SERIALIZER changed by a deploy: every call for a key cached before raised the
    # serializer's error until the entry's TTL ran out (up to a year).
    key, source = f"{unique()}:1", Source({"total": 10})
    with override_settings(COMPOSITION={**conf.as_dict(), "CACHE_SERIALIZER": f"{__name__}.PickyReprSerializer"}):
        assert cache_aside_result(key, source, ttl_s=300).outcome == "loaded"  # "{'total': 10}": not JSON
    pattern = key.split(":")[0]
    before = metric_value("composition_cache_errors_total", pattern=pattern, reason="unreadable_entry")
    hits = metric_value("composition_cache_hits_total", pattern=pattern)
    assert cache_aside_result(key, source, ttl_s=300) == ({"total": 10}, "uncached")
    after = metric_value("composition_cache_errors_total", pattern=pattern, reason="unreadable_entry")
    assert after - before == 1
    assert metric_value("composition_cache_hits_total", pattern=pattern) == hits  # an error, not a hit
    assert [cache_aside_result(key, source, ttl_s=300).outcome for _ in range(2)] == ["loaded", "hit"]
    # Something else's value under the entry's key: absent, loaded and replaced.
    other = f"{unique()}:2"
    engine = get_cache_aside()
    engine.client.set(engine.keys.entry(other), b"not an entry at all", ex=300)
    assert [cache_aside_result(other, Source(5), ttl_s=300).outcome for _ in range(2)] == ["loaded", "hit"]


def test_bad_serializer_path_is_a_configuration_error_and_a_check() -> None:
    composition = {**conf.as_dict(), "CACHE_SERIALIZER": "no.such.Serializer"}
    with override_settings(COMPOSITION=composition):
        with pytest.raises(CacheConfigurationError, match=r"no\.such\.Serializer"):
            cache_aside(f"{unique()}:1", lambda: 7, ttl_s=30)
        with pytest.raises(SystemCheckError, match=r"composition\.E042"):
            call_command("check")


@pytest.mark.parametrize(("key", "value", "check_id"), [
    ("CACHE_LEASE_WAIT_S", 0, "composition.E040"),
    ("CACHE_BREAKER_FAILURES", 0, "composition.E041"),
])
def test_cache_setting_checks(key: str, value: Any, check_id: str) -> None:
    with override_settings(COMPOSITION={key: value}), pytest.raises(SystemCheckError, match=check_id):
        call_command("check")


def test_cache_without_socket_timeouts_is_a_warning() -> None:
    from django.conf import settings
    from django.core.checks import run_checks

    caches = {"default": {**settings.CACHES["default"], "OPTIONS": {}}}
    with override_settings(CACHES=caches):
        assert "composition.W041" in {message.id for message in run_checks()}
    assert "composition.W041" not in {message.id for message in run_checks()}


def test_a_cache_location_that_is_no_redis_url_is_a_check_error_and_fails_the_start() -> None:
    # Taken for an outage ("continuing degraded"), the worker started its jobs and then failed
    # its start on the heartbeat, with an error that named neither the cache nor the setting.
    from django.conf import settings
    from django.core.checks import run_checks

    from composition.lifecycle.components import CacheComponent

    caches = {"default": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:abc/9"}}
    with override_settings(CACHES=caches):
        [error] = [message for message in run_checks() if message.id == "composition.E043"]
        assert "CACHES['default']['LOCATION']" in error.msg and "abc" in error.msg
        with pytest.raises(ValueError, match="abc"):
            CacheComponent("default").start()
    # Unreachable is still an outage to ride out, not a mistake.
    caches = {"default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{free_port()}/0"}}
    with override_settings(CACHES=caches):
        CacheComponent("default").start()


@pytest.mark.django_db(transaction=True)
def test_a_miss_inside_a_transaction_that_has_written_is_not_cached() -> None:
    # Read after the write and before invalidate(): the loader saw the transaction's own row,
    # cached, and a ROLLBACK left it there (the invalidation rolled back with it) till its TTL.
    from composition.locks.models import LockFence

    key = f"{unique('uncommitted')}:1"
    LockFence.objects.create(resource=key, fence=1)

    def load() -> int:
        return LockFence.objects.get(resource=key).fence

    with pytest.raises(RuntimeError), transaction.atomic():
        LockFence.objects.filter(resource=key).update(fence=2)
        assert cache_aside_result(key, load, ttl_s=60) == (2, "uncached")
        invalidate(key)
        raise RuntimeError("rolled back")
    assert get_cache_aside().peek(key) is None
    assert cache_aside_result(key, load, ttl_s=60) == (1, "loaded")
    # A transaction that has only read still caches (an ATOMIC_REQUESTS view that reads).
    invalidate(key)
    with transaction.atomic():
        assert cache_aside_result(key, load, ttl_s=60) == (1, "loaded")
    assert get_cache_aside().peek(key) == 1
