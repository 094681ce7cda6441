"""Liveness and readiness by role (``checks``), worker health (``worker_health``), one bounded
probe per dependency (``probes``), whether composition's migrations are applied (``migrations``),
the workers' heartbeats in Redis (``heartbeats``) and the draining mark, in the process and
host-wide (``draining``). Invariant: a check changes nothing and answers within its deadline; a
draining process is never ready.
"""

from composition.health.checks import ROLES, CheckResult, HealthReport, liveness, readiness
from composition.health.draining import is_draining, set_draining
from composition.health.worker_health import workers

__all__ = ["ROLES", "CheckResult", "HealthReport", "is_draining", "liveness", "readiness", "set_draining", "workers"]
