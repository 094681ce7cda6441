"""docs/metrics.md read as the tests read it: the catalogue of every metric composition and
billing export, with their types and labels, and the names the alert rules, the dashboard and
the scrapes are checked against."""

from __future__ import annotations

import re

from prometheus_client.metrics import MetricWrapperBase

import billing.metrics
import composition.metrics
from tests.helpers import ROOT

DOCS = ROOT / "docs"
DOCKER = ROOT / "docker"
OWN_PREFIXES = ("composition_", "billing_")
CATALOGUED_PREFIXES = (*OWN_PREFIXES, "django_")
CATALOGUE_ROW = re.compile(r"^\| `([a-z_:][a-z0-9_:]*)` \| (counter|gauge|histogram) \|([^|]*)\|", re.MULTILINE)
METRIC_NAME = re.compile(r"\b((?:composition|billing|django)_[a-z0-9_]+)\b")
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")

# Documented families that only a runworkers process gives samples to, and why. The web process
# the scrape below reads runs no job and starts no component, and a labelled family with no
# child set prints its HELP and TYPE lines and nothing else: these would be present by name only.
# tests/prometheus/test_server.py scrapes a real runworkers process and finds samples of each.
RUNWORKERS_ONLY = {
    # The worker middleware around each job run (jobs run in runworkers' worker threads only).
    "composition_jobs_total": "a job run ended",
    "composition_job_duration_seconds": "a job run ended",
    "composition_jobs_in_progress": "a job run started",
    "composition_job_timeouts_total": "a job run hit its time limit (Dramatiq's TimeLimit in a worker)",
    "billing_invoice_reminders_total": "the send_invoice_reminder job ran",
    # A composed System (runworkers; ./run) times its components; a web process starts none.
    "composition_component_start_seconds": "a component started",
    "composition_component_stop_seconds": "a component stopped (seen once the process has drained)",
    # Set as runworkers' metrics sampler starts: its process's share of the `manage.py system`
    # budget (the web's is not reported). The other sampled gauges are sampled here in-process.
    "composition_db_connection_budget": "the metrics sampler started",
    # Beaten by runworkers' heartbeat component: a web target shows no sample (an unlabelled
    # gauge's 0 read as a worker not beaten since 1970).
    "composition_worker_heartbeat_timestamp_seconds": "a worker process beat",
}


# -- the catalogue ----------------------------------------------------------------------------
def catalogue() -> dict[str, tuple[str, tuple[str, ...]]]:
    """docs/metrics.md as ``{name: (type, labels)}``; names as exported (counters with ``_total``)."""
    rows = {}
    for name, kind, labels in CATALOGUE_ROW.findall((DOCS / "metrics.md").read_text()):
        assert name not in rows, f"{name} is listed twice in docs/metrics.md"
        rows[name] = (kind, tuple(re.findall(r"`([a-z_]+)`", labels)))
    return rows


def _exported_name(metric: MetricWrapperBase) -> str:
    return f"{metric._name}_total" if metric._type == "counter" else metric._name


def own_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """What composition and billing define (their ``metrics`` modules), as ``catalogue()`` reads."""
    return {_exported_name(value): (value._type, tuple(value._labelnames))
            for module in (composition.metrics, billing.metrics)
            for value in vars(module).values() if isinstance(value, MetricWrapperBase)}


def family_name(name: str, kind: str) -> str:
    """The family name prometheus_client's parser gives ``name`` (a counter's drops ``_total``)."""
    return name.removesuffix("_total") if kind == "counter" else name


def metric_in_catalogue(name: str, known: dict[str, tuple[str, tuple[str, ...]]]) -> bool:
    if name in known:
        return True
    base = next((name.removesuffix(s) for s in HISTOGRAM_SUFFIXES if name.endswith(s)), None)
    return base is not None and known.get(base, ("", ()))[0] == "histogram"

