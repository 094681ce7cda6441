"""Liveness, readiness by role and worker health (``checks``), one bounded probe per dependency
(``probes``), whether composition's migrations are applied (``migrations``), the workers'
heartbeats in Redis (``heartbeats``) and the draining mark, in the process and host-wide
(``draining``). Invariant: a check changes nothing and answers within its deadline; a draining
process is never ready.
"""

from composition.health.checks import ROLES, CheckResult, HealthReport, liveness, readiness, workers
from composition.health.draining import is_draining, set_draining

__all__ = ["ROLES", "CheckResult", "HealthReport", "is_draining", "liveness", "readiness", "set_draining", "workers"]
