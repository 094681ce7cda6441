"""Liveness and readiness: cheap probes without side effects.

Liveness touches no dependency. Readiness probes the dependencies concurrently under one deadline
(``HEALTH_DEADLINE_S``), reuses the answer for ``HEALTH_CACHE_S``, and fails for a dependency
critical to the process's role (``HEALTH_DEPENDENCIES``, ``HEALTH_WORKER_DEPENDENCIES``) and
while composition's migrations are not applied (``migrations``, at the database's level); a
draining process is never ready. Worker health is ``worker_health``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from composition.conf import conf
from composition.errors import ConfigurationError, described
from composition.health.draining import is_draining
from composition.health.migrations import forget_applied_migrations, probe_migrations
from composition.health.probes import PROBES
from composition.metrics import HEALTH_CHECK_SECONDS, HEALTH_CHECK_UP

__all__ = ["DEGRADED_WAIT_S", "ROLES", "CheckResult", "HealthReport", "liveness", "readiness"]

_cache_lock = threading.Lock()
_round_lock = threading.Lock()
# The last report per role, with the monotonic time it was made.
_cached: dict[str, tuple[float, HealthReport]] = {}

ROLES = ("web", "worker")
# How long a readiness answer waits for a degraded dependency's probe at least (critical ones get
# the whole HEALTH_DEADLINE_S): a healthy cache or broker answers in milliseconds.
DEGRADED_WAIT_S = 0.25
# What readiness runs: each dependency's probe, and the check of the database's schema, which
# counts at the database's level (a process that ignores the database ignores its schema too).
READINESS_PROBES: dict[str, Callable[[float], None]] = {**PROBES, "migrations": probe_migrations}


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
        """The report as JSON; ``public`` keeps each failing check's error kind only, and the
        report's own ``error`` too (what an HTTP endpoint shows), the full error being for the
        operator's command and the log."""
        body: dict[str, Any] = {"status": "ok" if self.ok else "fail", "kind": self.kind}
        if self.checks:
            body["checks"] = {c.name: (c.as_public_dict() if public else c.as_dict()) for c in self.checks}
            failing = [c.name for c in self.checks if not c.ok]
            if failing:
                body["failing"] = failing
        body.update(self.detail)
        if public and isinstance(body.get("error"), str):
            # A report's own error (the worker check's unreadable Redis) is a driver's message too.
            body["error"] = body["error"].split(":", 1)[0]
        return body


def liveness() -> HealthReport:
    return HealthReport("liveness", True)


# Names of probes whose thread has not reported yet. Not ``Thread.is_alive()``: a thread that
# has reported is still alive for a moment, and the next round would call its dependency down.
_probes_in_flight: set[str] = set()
_in_flight_lock = threading.Lock()


def dependency_levels(role: str) -> dict[str, str]:
    """Each readiness probe's level for ``role``: "critical", "degraded" or "ignore"."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}: expected one of {', '.join(ROLES)}")
    levels = conf.HEALTH_DEPENDENCIES if role == "web" else conf.HEALTH_WORKER_DEPENDENCIES
    found = {name: levels.get(name, "critical") for name in PROBES}
    return {**found, "migrations": found["database"]}


def _run_probes(levels: dict[str, str], deadline_s: float) -> list[CheckResult]:
    """Run every probe concurrently under one deadline. A probe still hanging from an earlier
    round is not started again (its dependency is reported down), so a frozen server does
    not pile up a thread per readiness request."""
    outcomes: dict[str, tuple[float, str | None]] = {}
    # Settings the dependency cannot be used with (a BROKER_URL of another scheme) fail readiness
    # whatever its level: no retry mends them, and a "degraded" broker let a web process whose
    # every publish() raises answer ready.
    misconfigured: set[str] = set()
    done = threading.Condition()
    began = time.monotonic()

    def run(name: str, probe: Callable[[float], None]) -> None:
        start = time.monotonic()
        error = None
        try:
            probe(deadline_s)
        except ConfigurationError as exc:
            error = described(exc)[:300]
            misconfigured.add(name)
        except Exception as exc:
            error = described(exc)[:300]
        with _in_flight_lock:
            _probes_in_flight.discard(name)
        with done:
            outcomes[name] = (time.monotonic() - start, error)
            done.notify_all()

    names = [name for name, level in levels.items() if level != "ignore"]
    for name in names:
        with _in_flight_lock:
            still_hanging = name in _probes_in_flight
            _probes_in_flight.add(name)
        if still_hanging:
            outcomes[name] = (0.0, "the previous probe has not answered yet")
            continue
        # A daemon thread: a probe that hangs (a server that accepts but never answers) is
        # abandoned at the deadline, and neither the answer nor the process exit waits for it.
        threading.Thread(target=run, args=(name, READINESS_PROBES[name]), name=f"probe-{name}", daemon=True).start()
    critical = [name for name in names if levels[name] == "critical"]
    with done:
        # The answer waits for the critical probes only, up to the deadline; a degraded one gets
        # at least DEGRADED_WAIT_S. A hung cache cannot fail readiness, and must not delay it past
        # a load balancer's probe timeout (Kubernetes' is 1 s) and make every replica unready.
        done.wait_for(lambda: all(name in outcomes for name in critical), timeout=deadline_s)
        rest_s = min(deadline_s, DEGRADED_WAIT_S) - (time.monotonic() - began)
        if rest_s > 0:
            done.wait_for(lambda: len(outcomes) == len(names), timeout=rest_s)
        snapshot = dict(outcomes)
    results = []
    for name in names:
        if name in snapshot:
            took, error = snapshot[name]
        else:
            took = time.monotonic() - began
            error = f"no answer within {took:.2f}s"
        HEALTH_CHECK_SECONDS.labels(name).observe(took)
        HEALTH_CHECK_UP.labels(name).set(0 if error else 1)
        results.append(CheckResult(name, error is None, levels[name] == "critical" or name in misconfigured, took,
                                   error))
    return results


def _fresh_report(role: str) -> HealthReport | None:
    with _cache_lock:
        cached = _cached.get(role)
        if cached is not None and time.monotonic() - cached[0] < float(conf.HEALTH_CACHE_S):
            return cached[1]
    return None


def _last_report(role: str) -> HealthReport | None:
    with _cache_lock:
        cached = _cached.get(role)
    return cached[1] if cached is not None else None


def reset_readiness_cache() -> None:
    """Forget every cached answer: the next readiness call probes, the migrations' too."""
    with _cache_lock:
        _cached.clear()
    forget_applied_migrations()


def readiness(*, use_cache: bool = True, role: str = "web") -> HealthReport:
    """Probe every dependency of ``role`` under one deadline; cached for ``HEALTH_CACHE_S``.

    One round of probes runs at a time: a caller arriving while one runs gets the last report
    at once, or, before there is any, waits for the round and shares its answer, so two load
    balancers asking together never see each other's probes as hung ones. Not waiting when it
    can answer keeps a hanging dependency from holding a request thread per caller for the
    whole deadline, which could leave none for liveness.
    """
    levels = dependency_levels(role)
    if is_draining():
        return HealthReport("readiness", False, detail={"draining": True, "role": role})
    if use_cache and (fresh := _fresh_report(role)) is not None:
        return fresh
    deadline_s = float(conf.HEALTH_DEADLINE_S)
    if not _round_lock.acquire(blocking=False):
        if use_cache and (last := _last_report(role)) is not None:
            return last  # the round under way answers the callers after it
        if not _round_lock.acquire(timeout=deadline_s + 1.0):
            return HealthReport("readiness", False, detail={"error": "readiness probes did not finish in time",
                                                            "role": role})
    try:
        if use_cache and (fresh := _fresh_report(role)) is not None:
            return fresh  # the round we waited for
        checks = _run_probes(levels, deadline_s)
        report = HealthReport("readiness", all(c.ok or not c.critical for c in checks), checks,
                              detail={"role": role})
        with _cache_lock:
            _cached[role] = (time.monotonic(), report)
        return report
    finally:
        _round_lock.release()
