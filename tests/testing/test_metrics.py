"""``composition.testing.metric_value``: one number from a registry or from a scrape's text."""

from __future__ import annotations

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


def test_what_is_not_there_reads_zero() -> None:
    registry = _registry()
    assert metric_value("demo_jobs_total", registry, actor="nobody") == 0
    assert metric_value("no_such_metric", registry) == 0


def test_a_scrape_s_text_reads_as_its_registry_does() -> None:
    registry = _registry()
    text = generate_latest(registry).decode()
    for labels in ({"actor": "pay"}, {"outcome": "success"}, {}):
        assert metric_value("demo_jobs_total", text, **labels) == metric_value("demo_jobs_total", registry, **labels)
    assert metric_value("demo_seconds_count", text, actor="pay") == 1
