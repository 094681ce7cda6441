"""Every Prometheus metric composition exports, defined once, units in the names.

Multiprocess mode: when ``PROMETHEUS_MULTIPROC_DIR`` is set in the environment before
``prometheus_client`` is first imported, every process writes its samples there and
``/metrics`` merges them.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "COMPONENT_START_SECONDS",
    "COMPONENT_STOP_SECONDS",
    "HEALTH_CHECK_SECONDS",
    "HEALTH_CHECK_UP",
    "WORKER_HEARTBEAT_TIMESTAMP",
]

COMPONENT_START_SECONDS = Histogram(
    "composition_component_start_seconds", "Time a component took to start.", ["component"],
)
COMPONENT_STOP_SECONDS = Histogram(
    "composition_component_stop_seconds", "Time a component took to stop.", ["component", "status"],
)
HEALTH_CHECK_SECONDS = Histogram(
    "composition_health_check_seconds", "Duration of one dependency probe.", ["dependency"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0),
)
HEALTH_CHECK_UP = Gauge(
    "composition_health_check_up", "1 when the last probe of a dependency succeeded.", ["dependency"],
    multiprocess_mode="livemostrecent",
)
WORKER_HEARTBEAT_TIMESTAMP = Gauge(
    "composition_worker_heartbeat_timestamp_seconds", "Unix time of a worker process's last heartbeat.",
    multiprocess_mode="max",
)
