"""``/metrics`` restricted by a bearer token and/or a client address allowlist: the web view and
runworkers' metrics server answer alike (401, 403, or the metrics)."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.test import Client, override_settings

from composition.prometheus import MetricsServerComponent
from composition.testing import free_port

TOKEN = "s3cret-scrape-token"


def _policy(**keys: Any) -> Any:
    return override_settings(COMPOSITION={**settings.COMPOSITION, **keys})


# -- the web view -----------------------------------------------------------------------------------
def test_open_by_default(client: Client) -> None:
    assert client.get("/metrics").status_code == 200


@pytest.mark.django_db
def test_an_invented_http_method_makes_no_series_of_its_own(client: Client) -> None:
    # The request-latency family took the method as sent: one set of buckets per invented verb.
    for verb in ("BOGUS1", "BOGUS2"):
        assert client.generic(verb, "/api/invoices").status_code in (401, 405)
    scrape = client.get("/metrics").content.decode()
    assert "BOGUS" not in scrape
    assert 'django_http_requests_latency_seconds_by_view_method_count{method="<invalid method>"' in scrape


def test_a_token_is_required_when_set(client: Client) -> None:
    with _policy(METRICS_TOKEN=TOKEN):
        missing = client.get("/metrics")
        wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer not-it")
        basic = client.get("/metrics", HTTP_AUTHORIZATION=f"Basic {TOKEN}")
        right = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert (missing.status_code, wrong.status_code, basic.status_code) == (401, 401, 401)
    assert missing["WWW-Authenticate"].startswith("Bearer")
    assert b"composition_" not in missing.content
    assert right.status_code == 200 and b"# TYPE" in right.content


def test_an_address_outside_the_allowlist_is_refused(client: Client) -> None:
    with _policy(METRICS_ALLOWED_NETWORKS=["10.0.0.0/8", "192.168.1.7"]):
        local = client.get("/metrics")  # the test client's REMOTE_ADDR is 127.0.0.1
        inside = client.get("/metrics", REMOTE_ADDR="10.20.30.40")
        single = client.get("/metrics", REMOTE_ADDR="192.168.1.7")
        mapped = client.get("/metrics", REMOTE_ADDR="::ffff:10.1.1.1")  # a dual-stack socket's IPv4 peer
    assert local.status_code == 403
    assert (inside.status_code, single.status_code, mapped.status_code) == (200, 200, 200)


def test_with_both_the_address_is_checked_first(client: Client) -> None:
    with _policy(METRICS_TOKEN=TOKEN, METRICS_ALLOWED_NETWORKS=["10.0.0.0/8"]):
        outside = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        inside_no_token = client.get("/metrics", REMOTE_ADDR="10.0.0.5")
        inside = client.get("/metrics", REMOTE_ADDR="10.0.0.5", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert (outside.status_code, inside_no_token.status_code, inside.status_code) == (403, 401, 200)


def test_malformed_policies_are_reported_by_checks() -> None:
    with _policy(METRICS_TOKEN="", METRICS_ALLOWED_NETWORKS=["10.0.0.0/33"], WORKER_METRICS_PORT=70000):
        ids = {message.id for message in run_checks()}
    assert {"composition.E070", "composition.E071", "composition.E072"} <= ids
    with _policy(METRICS_ALLOWED_NETWORKS="10.0.0.0/8"):  # a string, not a list
        assert "composition.E072" in {message.id for message in run_checks()}


# -- runworkers' metrics server --------------------------------------------------------------------
def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def metrics_server() -> Iterator[MetricsServerComponent]:
    server = MetricsServerComponent(free_port(), address="127.0.0.1")
    server.start()
    yield server
    server.stop(5.0)
    assert not server.alive()


def test_the_worker_server_applies_the_same_policy(metrics_server: MetricsServerComponent) -> None:
    url = f"http://127.0.0.1:{metrics_server.port}/metrics"
    status, body = _get(url)
    assert status == 200 and b"# TYPE" in body
    with _policy(METRICS_TOKEN=TOKEN):
        assert _get(url)[0] == 401
        assert _get(url, "wrong")[0] == 401
        assert _get(url, TOKEN)[0] == 200
    with _policy(METRICS_ALLOWED_NETWORKS=["10.0.0.0/8"]):
        assert _get(url)[0] == 403
    with _policy(METRICS_ALLOWED_NETWORKS=["127.0.0.0/8", "::1/128"]):
        assert _get(url)[0] == 200


def test_the_worker_server_frees_its_port_on_stop() -> None:
    port = free_port()
    first = MetricsServerComponent(port, address="127.0.0.1")
    first.start()
    first.stop(5.0)
    second = MetricsServerComponent(port, address="127.0.0.1")
    second.start()  # would fail with EADDRINUSE if the first still held it
    second.stop(5.0)


@pytest.mark.django_db
def test_the_counters_alerts_take_increase_of_exist_at_zero_from_the_start(client: Client) -> None:
    # A series first seen at 1 has one sample, so increase() over it is empty: the first dead
    # letter of an actor after a worker started fired no DeadLettersAppearing alert.
    from composition.broker.configured import configured_broker
    from composition.jobs.middleware.job_metrics import JobMetrics
    from composition.jobs.middleware.stack import find_middleware

    broker = configured_broker()
    metrics = find_middleware(broker, JobMetrics)
    assert metrics is not None
    metrics.after_process_boot(broker)  # what runworkers' process boot runs
    scrape = client.get("/metrics").content.decode()
    for actor in ("refuses", "send_payment_receipt"):
        assert f'composition_dead_letters_total{{actor="{actor}"}}' in scrape
        assert f'composition_job_timeouts_total{{actor="{actor}"}}' in scrape
    queue = next(iter(settings.COMPOSITION["BACKPRESSURE_QUEUES"]))
    assert f'composition_backpressure_rejections_total{{queue="{queue}"}}' in scrape
