"""Errors of the Prometheus exposition: configuration apart from runtime failures."""

from __future__ import annotations

from composition.errors import CompositionError, ConfigurationError

__all__ = ["MetricsAccessConfigurationError", "MetricsDirectoryBusy"]


class MetricsDirectoryBusy(CompositionError, TimeoutError):
    """The multiprocess directory's lock was not had within its timeout (a merge or a scrape
    held it that long); ``directory`` names it."""

    def __init__(self, directory: str, timeout_s: float) -> None:
        super().__init__(f"metrics directory {directory} stayed locked for {timeout_s:.1f}s")
        self.directory = directory


class MetricsAccessConfigurationError(ConfigurationError):
    """METRICS_TOKEN or METRICS_ALLOWED_NETWORKS is unusable."""
