"""Prometheus exposition from every process: the multiprocess directory kept small and
consistent, and ``/metrics`` served with an access policy.

Modules: ``directory`` (per-process files and the merge lock), ``merging`` (how a dead process's
samples fold in), ``archive`` (journaled merges of dead processes' files), ``collector`` (the
locked collector every scrape reads), ``access`` (``METRICS_TOKEN``, ``METRICS_ALLOWED_NETWORKS``),
``server`` (``MetricsServerComponent``), ``errors``. The metrics are defined in ``composition.metrics``.
"""

from __future__ import annotations

from composition.prometheus.access import MetricsAccess, Refusal
from composition.prometheus.archive import archive_dead_processes, archive_processes
from composition.prometheus.collector import LockedMultiProcessCollector, render, scrape_registry
from composition.prometheus.directory import multiproc_dir
from composition.prometheus.errors import MetricsAccessConfigurationError, MetricsDirectoryBusy
from composition.prometheus.server import MetricsServerComponent

__all__ = [
    "LockedMultiProcessCollector",
    "MetricsAccess",
    "MetricsAccessConfigurationError",
    "MetricsDirectoryBusy",
    "MetricsServerComponent",
    "Refusal",
    "archive_dead_processes",
    "archive_processes",
    "multiproc_dir",
    "render",
    "scrape_registry",
]
