"""Read a metric the way a test asserts on it: one number, whatever the registry or scrape."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["metric_value"]


def metric_value(sample: str, /, source: CollectorRegistry | str | None = None, **labels: str) -> float:
    """The sum of the samples named ``sample`` whose labels include ``labels`` (0 when there is
    none), read from ``source``: a registry (this process's by default) or the text of a scrape
    (a ``/metrics`` body). A sample is named as exposed: ``composition_jobs_total``,
    ``composition_job_duration_seconds_count``."""
    families = text_string_to_metric_families(source) if isinstance(source, str) else (source or REGISTRY).collect()
    return sum(found.value for family in families for found in family.samples
               if found.name == sample and all(found.labels.get(key) == value for key, value in labels.items()))
