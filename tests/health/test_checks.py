"""Liveness, readiness and the health command against real, closed and frozen services."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import Client, override_settings
from structlog.testing import capture_logs

from composition.conf import conf
from composition.health import checks as health
from composition.health.draining import set_draining
from composition.testing import ThrowawayRedis, free_port, subprocess_env

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_readiness() -> Iterator[None]:
    health.reset_readiness_cache()
    set_draining(False)
    yield
    health.reset_readiness_cache()
    set_draining(False)


def _cache_at(url: str) -> dict[str, Any]:
    return {"default": {**settings.CACHES["default"], "LOCATION": url}}


def test_readyz_is_200_when_every_dependency_answers(client: Client) -> None:
    response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ok"
    assert set(body["checks"]) == {"database", "cache", "broker", "migrations"}


def _broker_critical_for_web(**overrides: Any) -> dict[str, Any]:
    """COMPOSITION where the web role needs the broker too (a project may choose that)."""
    levels = {"database": "critical", "cache": "degraded", "broker": "critical"}
    return {**settings.COMPOSITION, "HEALTH_DEPENDENCIES": levels, **overrides}


def test_readyz_is_503_naming_the_critical_dependency_that_is_down(client: Client) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"
    with override_settings(COMPOSITION=_broker_critical_for_web(BROKER_URL=closed)), capture_logs() as logs:
        response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 503
    assert body["failing"] == ["broker"]
    (logged,) = [entry for entry in logs if entry["event"] == "readiness check failing"]
    assert "Connection" in logged["failing"]["broker"]  # the detail goes to the log
    assert "Connection" in body["checks"]["broker"]["error"]
    # The body names the kind of failure, never the address (or user) the driver's message has.
    port = closed.rsplit(":", 1)[1].split("/")[0]
    assert port not in response.content.decode() and "127.0.0.1" not in response.content.decode()


def test_cache_outage_is_reported_degraded_without_failing_readiness(client: Client) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"
    with override_settings(CACHES=_cache_at(closed)):
        response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 200
    assert body["checks"]["cache"]["ok"] is False
    assert body["checks"]["cache"]["critical"] is False


def test_readiness_is_answered_within_the_deadline_when_a_server_is_frozen(
        client: Client, throwaway_redis_server: ThrowawayRedis) -> None:
    throwaway_redis_server.freeze()
    overrides = _broker_critical_for_web(BROKER_URL=throwaway_redis_server.url, HEALTH_DEADLINE_S=0.5)
    with override_settings(COMPOSITION=overrides):
        began = time.monotonic()
        response = client.get("/readyz")
        took = time.monotonic() - began
    assert response.status_code == 503
    assert response.json()["failing"] == ["broker"]
    assert took < 1.5


def test_a_frozen_degraded_dependency_does_not_hold_the_answer_past_a_probe_timeout(
        client: Client, throwaway_redis_server: ThrowawayRedis) -> None:
    # The cache and the broker on one Redis that hangs: both degraded for the web. The answer
    # waited the whole 2 s deadline for them, past Kubernetes' 1 s probe timeout, and every
    # replica went unready at once over a dependency that cannot fail readiness.
    throwaway_redis_server.freeze()
    overrides = {**settings.COMPOSITION, "BROKER_URL": throwaway_redis_server.url, "HEALTH_DEADLINE_S": 2.0}
    with override_settings(COMPOSITION=overrides, CACHES=_cache_at(throwaway_redis_server.url)):
        began = time.monotonic()
        response = client.get("/readyz")
        took = time.monotonic() - began
    body = response.json()
    assert response.status_code == 200, body
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["broker"]["ok"] is False and "no answer within" in body["checks"]["broker"]["error"]
    # Given up on after DEGRADED_WAIT_S (0.25 s), not the deadline; the wall time only catches a
    # wait for the deadline (it read 2.04 s), with room for a busy machine's database probe.
    assert body["checks"]["broker"]["duration_s"] < 1.0, body
    assert took < 1.5, took


def test_with_the_broker_stopped_web_stays_ready_and_worker_readiness_fails(
        client: Client, throwaway_redis_server: ThrowawayRedis) -> None:
    with override_settings(COMPOSITION={**settings.COMPOSITION, "BROKER_URL": throwaway_redis_server.url}):
        assert health.readiness(role="worker").ok
        throwaway_redis_server.stop()
        health.reset_readiness_cache()
        response = client.get("/readyz")
        worker = health.readiness(role="worker")
    body = response.json()
    assert response.status_code == 200, body  # writes need only PostgreSQL: the outbox holds them
    assert body["checks"]["broker"] == {**body["checks"]["broker"], "ok": False, "critical": False}
    assert body["role"] == "web"
    assert not worker.ok
    assert [check.name for check in worker.checks if not check.ok] == ["broker"]


def test_a_broker_url_nothing_can_use_fails_web_readiness_too(client: Client) -> None:
    """A web process with a BROKER_URL of another scheme loads (gunicorn runs no checks), and
    every publish() raises: "degraded" let it answer ready."""
    with override_settings(COMPOSITION={**settings.COMPOSITION, "BROKER_URL": "rediss//oops"}):
        response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 503, body
    assert body["checks"]["broker"] == {**body["checks"]["broker"], "ok": False, "critical": True}


def test_readiness_of_an_unknown_role_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown role 'cron'"):
        health.readiness(role="cron")


def test_readiness_answer_is_reused_for_the_cache_period() -> None:
    first = health.readiness()
    assert health.readiness() is first
    assert health.readiness(use_cache=False) is not first


def test_draining_process_is_not_ready_but_still_alive(client: Client) -> None:
    set_draining(True)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["draining"] is True
    assert client.get("/healthz").status_code == 200


def test_healthz_never_touches_a_dependency(client: Client) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"
    overrides = {**settings.COMPOSITION, "BROKER_URL": closed}
    with override_settings(COMPOSITION=overrides, CACHES=_cache_at(closed)):
        assert client.get("/healthz").status_code == 200


def test_metrics_endpoint_serves_prometheus_text(client: Client) -> None:
    client.get("/readyz")
    response = client.get("/metrics")
    assert response.status_code == 200
    assert b"composition_health_check_seconds" in response.content


# -- the health command, as an operator runs it --------------------------------------------------
def _health(kind: str, redis_url: str, *extra: str) -> tuple[int, float, str]:
    env = subprocess_env(REDIS_URL=redis_url)
    env.pop("BROKER_URL", None)  # the default broker is REDIS_URL
    began = time.monotonic()
    result = subprocess.run([sys.executable, "manage.py", "health", kind, *extra], env=env,
                            capture_output=True, text=True, timeout=30)
    return result.returncode, time.monotonic() - began, result.stdout + result.stderr


def _settled_start_cost() -> float:
    """How long starting ``manage.py`` takes here, so the bound measures only the probe."""
    code, took, _ = _health("liveness", os.environ.get("REDIS_URL", settings.CACHES["default"]["LOCATION"]))
    assert code == 0
    return took


@pytest.mark.slow
def test_health_command_readiness_exit_codes_for_up_closed_and_frozen(
        throwaway_redis_server: ThrowawayRedis) -> None:
    startup_s = _settled_start_cost()
    up = throwaway_redis_server.url
    code, _, out = _health("readiness", up, "--json")
    assert code == 0, out
    assert json.loads(out[out.index("{"):])["status"] == "ok"

    closed = f"redis://127.0.0.1:{free_port()}/0"
    code, took, out = _health("readiness", closed, "--role", "worker")
    assert code == 1, out
    assert "broker: FAIL" in out
    # A refused connection fails at once: the probe's own time says so; the wall time around the
    # process only catches a hang (it read 4.2 s beside the gate's busiest shard).
    code, took, out = _health("readiness", closed, "--role", "worker", "--json")
    assert code == 1 and json.loads(out[out.index("{"):])["checks"]["broker"]["duration_s"] < 1.0, out
    assert took < 2 * float(conf.HEALTH_DEADLINE_S) + 3 * startup_s, (took, startup_s)

    throwaway_redis_server.freeze()
    code, took, out = _health("readiness", up, "--role", "worker", "--json")
    assert code == 1, out
    broker = json.loads(out[out.index("{"):])["checks"]["broker"]
    # The readiness deadline and the clients' socket timeouts are both 2 s: either says it. redis-py
    # words its socket time-out two ways ("from socket" in its parsers, "from <host>:<port>" in
    # the connection), depending on where the read was when the time ran out.
    assert "no answer within" in broker["error"] or "Timeout reading from " in broker["error"], out
    # The probe's own time, as the command measured it: bounded by the deadline. The wall time
    # around the process only catches a hang (beside the gate's other shards, starting and ending
    # manage.py took 2.5 s where it takes 0.9 alone, and failed a tighter bound).
    assert broker["duration_s"] < float(conf.HEALTH_DEADLINE_S) + 0.5, broker
    assert took < 2 * float(conf.HEALTH_DEADLINE_S) + 3 * startup_s, (took, startup_s)

    for url in (up, closed):
        code, _, out = _health("liveness", url)
        assert code == 0, out
    throwaway_redis_server.thaw()
    assert _health("liveness", up)[0] == 0


def test_health_command_usage_error_exits_2() -> None:
    code, _, out = _health("nonsense", "redis://127.0.0.1:1/0")
    assert code == 2
    assert "invalid choice" in out
    # A flag on the kind it does not apply to is a usage error too, not "unhealthy".
    code, _, out = _health("liveness", "redis://127.0.0.1:1/0", "--local")
    assert code == 2, out
    assert "--local applies to `health workers` only" in out
    code, _, out = _health("workers", "redis://127.0.0.1:1/0", "--role", "worker")
    assert code == 2, out
    assert "--role applies to `health readiness` only" in out


def test_a_caller_arriving_during_a_round_gets_the_last_report_at_once_rather_than_wait() -> None:
    # A round under way (a hanging dependency's, say): waiting for it would hold this caller's
    # request thread for the whole deadline, and enough such callers starve /healthz.
    health.reset_readiness_cache()
    last = health.readiness()
    assert last.ok
    with override_settings(COMPOSITION={**settings.COMPOSITION, "HEALTH_CACHE_S": 0}):
        assert health._round_lock.acquire(timeout=5)
        try:
            began = time.monotonic()
            assert health.readiness() is last
            assert time.monotonic() - began < 0.5
        finally:
            health._round_lock.release()


def test_concurrent_readiness_checks_share_one_round_and_agree() -> None:
    import threading

    results: list[bool] = []
    for _ in range(10):
        health.reset_readiness_cache()
        barrier = threading.Barrier(4)

        def check(barrier: threading.Barrier) -> None:
            barrier.wait()
            results.append(health.readiness().ok)

        threads = [threading.Thread(target=check, args=(barrier,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
    assert results == [True] * 40
