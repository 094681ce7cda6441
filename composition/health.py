"""Liveness, readiness and worker health: cheap probes without side effects.

- liveness never touches a dependency: the process answers, so it is alive;
- readiness probes the database, the cache and the broker concurrently under one overall
  deadline (``HEALTH_DEADLINE_S``) and reuses the answer for ``HEALTH_CACHE_S``; each dependency
  is "critical" (fails readiness) or "degraded" (reported, still ready); a draining process is
  never ready;
- workers reads the heartbeats that ``runworkers`` processes write.

A probe that hangs (a frozen server accepts but never answers) is abandoned at the deadline: it
runs in a daemon thread, so neither the answer nor the process exit waits for it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connections

from composition.broker import broker_kind
from composition.conf import conf
from composition.heartbeats import read_heartbeats
from composition.metrics import HEALTH_CHECK_SECONDS, HEALTH_CHECK_UP

__all__ = [
    "CheckResult",
    "HealthReport",
    "is_draining",
    "liveness",
    "readiness",
    "set_draining",
    "workers",
]

_draining = threading.Event()
_cache_lock = threading.Lock()
_round_lock = threading.Lock()
_cached: tuple[float, HealthReport] | None = None


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    critical: bool
    duration_s: float
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "critical": self.critical, "duration_s": round(self.duration_s, 4),
                "error": self.error}

    def as_public_dict(self) -> dict[str, Any]:
        """``as_dict`` with the error cut to its kind (``OperationalError``, ``TimeoutError``):
        a driver's message names hosts, ports, users and databases, which a public endpoint must
        not tell whoever asks."""
        error = self.error.split(":", 1)[0] if self.error else None
        return {**self.as_dict(), "error": error}


@dataclass(frozen=True)
class HealthReport:
    kind: str
    ok: bool
    checks: list[CheckResult] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self, *, public: bool = False) -> dict[str, Any]:
        """The report as JSON; ``public`` keeps each failing check's error kind only (what an
        HTTP endpoint shows), the full error being for the operator's command and the log."""
        body: dict[str, Any] = {"status": "ok" if self.ok else "fail", "kind": self.kind}
        if self.checks:
            body["checks"] = {c.name: (c.as_public_dict() if public else c.as_dict()) for c in self.checks}
            failing = [c.name for c in self.checks if not c.ok]
            if failing:
                body["failing"] = failing
        body.update(self.detail)
        return body


def set_draining(value: bool = True) -> None:
    """Mark this process as draining: readiness fails from now on."""
    if value:
        _draining.set()
    else:
        _draining.clear()


def is_draining() -> bool:
    return _draining.is_set()


def liveness() -> HealthReport:
    return HealthReport("liveness", True)


# -- probes ------------------------------------------------------------------------------------
def probe_database(timeout_s: float) -> None:
    """A fresh connection (never one a request or job is using) with the probe's own connect
    and statement timeouts, so a frozen server cannot hold the probe beyond ``timeout_s``."""
    import psycopg

    # Everything the application connects with (TLS client certificates, service files,
    # target_session_attrs...) except what only Django's own connection understands.
    params = {key: value for key, value in connections["default"].get_connection_params().items()
              if key not in ("cursor_factory", "context", "prepare_threshold", "pool", "server_side_binding",
                             "assume_role")}
    params["connect_timeout"] = max(1, math.ceil(timeout_s))
    with psycopg.connect(**params, autocommit=True) as conn:
        # A SET rather than a startup option: poolers such as PgBouncer refuse unknown ones.
        conn.execute(f"SET statement_timeout = {max(1, int(timeout_s * 1000))}")
        conn.execute("SELECT 1").fetchone()


def _redis_url_of_cache() -> str:
    location = settings.CACHES[conf.CACHE_ALIAS]["LOCATION"]
    return location[0] if isinstance(location, list | tuple) else str(location)


def _ping_redis(url: str, timeout_s: float) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        client.ping()
    finally:
        client.close()


def probe_cache(timeout_s: float) -> None:
    _ping_redis(_redis_url_of_cache(), timeout_s)


def probe_broker(timeout_s: float) -> None:
    url = conf.BROKER_URL
    if broker_kind(url) == "redis":
        _ping_redis(url, timeout_s)
        return
    import pika

    params = pika.URLParameters(url)
    params.socket_timeout = timeout_s
    params.blocked_connection_timeout = timeout_s
    params.stack_timeout = timeout_s
    params.connection_attempts = 1
    pika.BlockingConnection(params).close()


PROBES: dict[str, Callable[[float], None]] = {
    "database": probe_database,
    "cache": probe_cache,
    "broker": probe_broker,
}


_running_probes: dict[str, threading.Thread] = {}


def _run_probes(deadline_s: float) -> list[CheckResult]:
    """Run every probe concurrently under one deadline. A probe still hanging from an earlier
    round is not started again (its dependency is reported down), so a frozen server does
    not pile up a thread per readiness request."""
    levels = conf.HEALTH_DEPENDENCIES
    outcomes: dict[str, tuple[float, str | None]] = {}
    done = threading.Condition()
    began = time.monotonic()

    def run(name: str, probe: Callable[[float], None]) -> None:
        start = time.monotonic()
        error = None
        try:
            probe(deadline_s)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        with done:
            outcomes[name] = (time.monotonic() - start, error)
            done.notify_all()

    names = [name for name in PROBES if levels.get(name, "critical") != "ignore"]
    for name in names:
        previous = _running_probes.get(name)
        if previous is not None and previous.is_alive():
            outcomes[name] = (0.0, "the previous probe has not answered yet")
            continue
        thread = threading.Thread(target=run, args=(name, PROBES[name]), name=f"probe-{name}", daemon=True)
        _running_probes[name] = thread
        thread.start()
    with done:
        done.wait_for(lambda: len(outcomes) == len(names), timeout=deadline_s)
        snapshot = dict(outcomes)
    results = []
    for name in names:
        critical = levels.get(name, "critical") == "critical"
        if name in snapshot:
            took, error = snapshot[name]
        else:
            took, error = time.monotonic() - began, f"no answer within {deadline_s:.1f}s"
        HEALTH_CHECK_SECONDS.labels(name).observe(took)
        HEALTH_CHECK_UP.labels(name).set(0 if error else 1)
        results.append(CheckResult(name, error is None, critical, took, error))
    return results


def _fresh_report() -> HealthReport | None:
    with _cache_lock:
        if _cached is not None and time.monotonic() - _cached[0] < float(conf.HEALTH_CACHE_S):
            return _cached[1]
    return None


def readiness(*, use_cache: bool = True) -> HealthReport:
    """Probe every dependency under one deadline; cached for ``HEALTH_CACHE_S``.

    One round of probes runs at a time: a caller arriving while one runs waits for it and
    shares its answer, so two load balancers asking together never see each other's probes as
    hung ones.
    """
    global _cached
    if is_draining():
        return HealthReport("readiness", False, detail={"draining": True})
    if use_cache and (fresh := _fresh_report()) is not None:
        return fresh
    deadline_s = float(conf.HEALTH_DEADLINE_S)
    if not _round_lock.acquire(timeout=deadline_s + 1.0):
        return HealthReport("readiness", False, detail={"error": "readiness probes did not finish in time"})
    try:
        if use_cache and (fresh := _fresh_report()) is not None:
            return fresh  # the round we waited for
        checks = _run_probes(deadline_s)
        report = HealthReport("readiness", all(c.ok or not c.critical for c in checks), checks)
        with _cache_lock:
            _cached = (time.monotonic(), report)
        return report
    finally:
        _round_lock.release()


# -- worker heartbeats -----------------------------------------------------------------------------
def heartbeat_client() -> Any:
    """A Redis client for the heartbeats, bounded by the health deadline."""
    import redis

    timeout_s = float(conf.HEALTH_DEADLINE_S)
    return redis.Redis.from_url(_redis_url_of_cache(), socket_connect_timeout=timeout_s,
                                socket_timeout=timeout_s)


def workers() -> HealthReport:
    """Healthy when at least one worker process beat recently and none is stuck on old work."""
    stale_after_s = float(conf.WORKER_STALE_AFTER_S)
    try:
        client = heartbeat_client()
        try:
            beats = read_heartbeats(client)
        finally:
            client.close()
    except Exception as exc:
        return HealthReport("workers", False, detail={"error": f"{type(exc).__name__}: {exc}"})
    now = time.time()
    fresh = [b for b in beats if now - b["beat_at"] <= stale_after_s]
    # A worker that keeps beating but has held one job for longer than that job may run (its
    # time limit, or WORKER_STUCK_AFTER_S for a job without one) is stuck.
    stuck = [b["worker"] for b in fresh if b.get("oldest_job_started_at")
             and now - b["oldest_job_started_at"] > (b.get("max_job_s") or float(conf.WORKER_STUCK_AFTER_S))]
    ok = bool(fresh) and not stuck
    return HealthReport("workers", ok, detail={"workers": beats, "fresh": len(fresh), "stuck": stuck})
