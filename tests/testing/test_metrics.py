"""``composition.testing.metric_value``: one number from a registry or from a scrape's text."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from composition.testing import metric_value


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    jobs = Counter("demo_jobs", "jobs", ["actor", "outcome"], registry=registry)
    jobs.labels("pay", "success").inc(3)
    jobs.labels("pay", "dead").inc()
    jobs.labels("mail", "success").inc(2)
    Histogram("demo_seconds", "time", ["actor"], registry=registry).labels("pay").observe(0.2)
    return registry


def test_labels_select_and_the_samples_they_leave_open_are_summed() -> None:
    registry = _registry()
    assert metric_value("demo_jobs_total", registry, actor="pay", outcome="success") == 3
    assert metric_value("demo_jobs_total", registry, actor="pay") == 4
    assert metric_value("demo_jobs_total", registry) == 6
    assert metric_value("demo_seconds_count", registry, actor="pay") == 1


def test_labels_not_seen_yet_read_zero() -> None:
    registry = _registry()
    assert metric_value("demo_jobs_total", registry, actor="nobody") == 0
    Counter("demo_unused", "never incremented", ["actor"], registry=registry)
    assert metric_value("demo_unused_total", registry) == 0
    assert metric_value("demo_unused_total", generate_latest(registry).decode()) == 0


def test_a_name_no_metric_exposes_is_refused_not_read_as_zero() -> None:
    registry = _registry()
    # A misspelt name would otherwise read 0, and a test asserting "nothing happened" could not fail.
    with pytest.raises(LookupError, match="did you mean 'demo_jobs_total'"):
        metric_value("demo_job_total", registry)
    with pytest.raises(LookupError, match="'demo_jobs'"):
        metric_value("demo_jobs", generate_latest(registry).decode())
    with pytest.raises(LookupError):
        metric_value("no_such_metric", CollectorRegistry())


def test_a_scrape_s_text_reads_as_its_registry_does() -> None:
    registry = _registry()
    text = generate_latest(registry).decode()
    for labels in ({"actor": "pay"}, {"outcome": "success"}, {}):
        assert metric_value("demo_jobs_total", text, **labels) == metric_value("demo_jobs_total", registry, **labels)
    assert metric_value("demo_seconds_count", text, actor="pay") == 1


def test_a_scrape_without_a_metric_this_process_declares_reads_zero() -> None:
    # Other processes' scrape (multiprocess mode) shows no metric none of them wrote yet.
    assert metric_value("composition_jobs_total", "", actor="anyone") == 0
    with pytest.raises(LookupError, match="composition_jobs_total"):
        metric_value("composition_job_total", "")
