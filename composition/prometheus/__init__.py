"""Prometheus exposition from every process: the multiprocess directory kept small and
consistent, and ``/metrics`` served with an access policy.

- ``directory``: the per-process files and the lock that keeps merging and scraping apart;
- ``merging``: how a dead process's samples fold into the archive, per kind and gauge mode;
- ``archive``: merging dead processes' files (journaled, so a merger's crash loses nothing);
- ``collector``: the locked ``MultiProcessCollector`` every scrape reads, and rendering;
- ``access``: the bearer token and client address allowlist (``METRICS_TOKEN``,
  ``METRICS_ALLOWED_NETWORKS``);
- ``server``: ``/metrics`` over HTTP for ``runworkers`` (``MetricsServerComponent``);
- ``errors``: what goes wrong.

The metrics themselves are defined in ``composition.metrics``.
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
