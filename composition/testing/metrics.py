"""Read a metric the way a test asserts on it: one number, whatever the registry or scrape."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from prometheus_client import REGISTRY, CollectorRegistry, Metric
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["metric_value"]

# The samples a metric of each type exposes, by suffix (prometheus_client's naming): a labelled
# metric with no child yet exposes none, and still names them.
_SAMPLE_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                    "gaugehistogram": ("_bucket", "_gcount", "_gsum"), "summary": ("", "_count", "_sum", "_created"),
                    "info": ("_info",)}


def metric_value(sample: str, /, source: CollectorRegistry | str | None = None, **labels: str) -> float:
    """The sum of the samples named ``sample`` whose labels include ``labels`` (0 when there is
    none yet), read from ``source``: a registry (this process's by default) or the text of a scrape
    (a ``/metrics`` body). A sample is named as exposed: ``composition_jobs_total``,
    ``composition_job_duration_seconds_count``.

    Raises LookupError when neither ``source`` nor this process's registry has a metric exposing
    a sample of that name, so that a misspelt name fails the test instead of reading 0 (a scrape
    of other processes may not show a metric none of them wrote yet: it reads 0)."""
    families = list(text_string_to_metric_families(source) if isinstance(source, str)
                    else (source or REGISTRY).collect())
    if sample not in (exposed := _exposed(families)):
        if source is not None and source is not REGISTRY:
            exposed |= _exposed(REGISTRY.collect())
        if sample not in exposed:
            close = difflib.get_close_matches(sample, sorted(exposed), n=3)
            raise LookupError(f"no metric exposes a sample named {sample!r}"
                              + (f" (did you mean {', '.join(map(repr, close))}?)" if close else ""))
    return sum(found.value for family in families for found in family.samples
               if found.name == sample and all(found.labels.get(key) == value for key, value in labels.items()))


def _exposed(families: Iterable[Metric]) -> set[str]:
    """The sample names ``families`` expose, or would once their metrics have a value."""
    families = list(families)
    names = {family.name + suffix for family in families for suffix in _SAMPLE_SUFFIXES.get(family.type, ("",))}
    return names | {found.name for family in families for found in family.samples}
