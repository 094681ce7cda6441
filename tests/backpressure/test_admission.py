"""Backpressure against real PostgreSQL and Redis."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.http import HttpResponse
from django.test import Client, RequestFactory, override_settings
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from composition.backpressure import admission as backpressure
from composition.backpressure.admission import (
    Backpressure,
    BackpressureMiddleware,
    admit,
)
from composition.backpressure.depth import queue_depth
from composition.broker.configured import configured_broker
from composition.checks import check_backpressure_settings
from composition.checks.load import BACKPRESSURE_MIDDLEWARE
from composition.outbox import OutboxMessage, publish
from composition.outbox.relay import Relay
from composition.testing import ThrowawayRedis, use_broker
from tests.helpers import HeldInAnotherTransaction
from tests.jobsapp import jobs
from tests.outboxapp.jobs import QUEUE, record_effect


@pytest.fixture(autouse=True)
def _fresh_depths() -> Iterator[None]:
    configured_broker().flush(QUEUE)
    backpressure._depths.clear()
    yield
    backpressure._depths.clear()
    configured_broker().flush(QUEUE)


def _limits(**queues: int) -> override_settings:
    return override_settings(COMPOSITION={**settings.COMPOSITION, "BACKPRESSURE_QUEUES": queues,
                                          "BACKPRESSURE_CACHE_S": 0.001})


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nudge_only")
def test_admit_counts_outbox_backlog_and_broker_messages() -> None:
    with _limits(**{QUEUE: 4}):
        admit(QUEUE)
        with transaction.atomic():
            for seq in range(3):
                publish(record_effect, {"seq": seq})
        assert queue_depth(QUEUE) == 3
        admit(QUEUE)  # 3 < 4
        # Relayed to the broker, the same messages still count: the backlog moved, it did not shrink.
        assert Relay(configured_broker()).run_until_idle() == 3
        assert queue_depth(QUEUE) == 3
        publish(record_effect, {"seq": 3})
        backpressure._depths.clear()
        with pytest.raises(Backpressure) as caught:
            admit(QUEUE)
    assert (caught.value.queue, caught.value.depth, caught.value.limit) == (QUEUE, 4, 4)
    assert caught.value.retry_after_s > 0
    # A name no setting limits and no job uses is admitted, said once: it is most likely misspelt.
    with capture_logs() as logs:
        admit("a-queue-without-limit")
        admit("a-queue-without-limit")
        admit(jobs.NOOP_QUEUE)  # a job's queue without a limit: admitted, nothing to say
    assert [(entry["event"].split(":")[0], entry["queue"]) for entry in logs] == [
        ("admit() of a queue no setting limits and no job uses", "a-queue-without-limit")]


@pytest.mark.django_db(transaction=True)
@pytest.mark.empty_queues("billing")
@pytest.mark.usefixtures("nudge_only")
def test_middleware_sheds_unsafe_requests_with_503_and_retry_after(api_client: Client,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    client = api_client
    with transaction.atomic():
        publish("send_payment_receipt", {"payment_id": 1})
    overrides = {**settings.COMPOSITION, "BACKPRESSURE_QUEUES": {"billing": 1},
                 "BACKPRESSURE_PATHS": {"/api/invoices": "billing"}, "BACKPRESSURE_CACHE_S": 0.001}
    with override_settings(COMPOSITION=overrides):
        shed_before = REGISTRY.get_sample_value("django_http_responses_total_by_status_total", {"status": "503"}) or 0
        response = client.post("/api/invoices", data=json.dumps({"number": "X", "customer": "c", "amount_cents": 5}),
                               content_type="application/json")
        assert response.status_code == 503
        # In the HTTP metrics as any response is: the 5xx rate and the dashboard stayed flat.
        assert REGISTRY.get_sample_value("django_http_responses_total_by_status_total",
                                         {"status": "503"}) == shed_before + 1
        assert response["Retry-After"] == "5"
        # Not the queue, its depth or limit: the caller may not even be authenticated.
        assert response.json() == {"code": "overloaded", "retry_after_s": 5,
                                   "error": "too much work is waiting: this request is not taken now; retry after 5 s"}
        # Its own warning says why, with the numbers; not also Django's error line, once per shed request.
        [shed] = [r for r in caplog.records if r.name == "composition.backpressure"]
        assert shed.levelno == logging.WARNING
        assert (shed.msg["queue"], shed.msg["depth"], shed.msg["limit"]) == ("billing", 1, 1)
        assert not [r for r in caplog.records if r.name == "django.request" and r.levelno >= logging.ERROR]
        assert client.get("/api/invoices/1").status_code == 404  # reads are never shed
        # Mounted under a prefix (SCRIPT_NAME), the paths are matched below it, as URLs are.
        mounted = BackpressureMiddleware(lambda request: HttpResponse(status=201))
        request = RequestFactory().post("/api/invoices", SCRIPT_NAME="/billing-service")
        assert request.path == "/billing-service/api/invoices"
        assert mounted(request).status_code == 503
        # The longest prefix decides, on a segment boundary: the first one in the setting's order
        # that was a plain string prefix shed other queues' requests with billing's.
        paths = {"/api/invoices": "billing", "/api/invoices/export": "reports"}  # reports: no limit
        with override_settings(COMPOSITION={**overrides, "BACKPRESSURE_PATHS": paths}):
            assert mounted(RequestFactory().post("/api/invoices/export/2026")).status_code == 201
            assert mounted(RequestFactory().post("/api/invoices-archive")).status_code == 201
            assert mounted(RequestFactory().post("/api/invoices/7/pay")).status_code == 503
    created = client.post("/api/invoices", data=json.dumps({"number": "X", "customer": "c", "amount_cents": 5}),
                          content_type="application/json")
    assert created.status_code == 201


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nudge_only")
def test_a_view_whose_own_admit_refuses_answers_503_with_retry_after(caplog: pytest.LogCaptureFixture) -> None:
    # Nothing turned Backpressure into a 503 outside BACKPRESSURE_PATHS: the view answered 500.
    with transaction.atomic():
        publish(record_effect, {"seq": 1})
    client = Client(raise_request_exception=False)
    with _limits(**{QUEUE: 1}):
        response = client.post(f"/test/admit/{QUEUE}")
        assert response.status_code == 503, response.content
        assert response["Retry-After"] == "5"
        assert response.json()["code"] == "overloaded"
        [shed] = [r for r in caplog.records if r.name == "composition.backpressure"]
        assert (shed.msg["queue"], shed.msg["depth"], shed.msg["limit"]) == (QUEUE, 1, 1)
        assert not [r for r in caplog.records if r.name == "django.request" and r.levelno >= logging.ERROR]
        assert client.post("/test/admit/a-queue-without-limit").status_code == 202


def test_backpressure_settings_are_checked() -> None:
    def ids(**composition: object) -> set[str]:
        with override_settings(COMPOSITION={**settings.COMPOSITION, **composition}):
            return {message.id for message in check_backpressure_settings()}

    assert ids() == set()
    assert ids(BACKPRESSURE_QUEUES={"billing": 0}) == {"composition.E051"}
    assert ids(BACKPRESSURE_PATHS={"api": "q"}) == {"composition.E052"}
    assert ids(BACKPRESSURE_PATHS={"/api": "unlimited"}) == {"composition.W050"}
    assert ids(BACKPRESSURE_RETRY_AFTER_S=0) == {"composition.E050"}
    # nan and inf passed the check, then a shed request's Retry-After raised (a 500, not a 503).
    assert ids(BACKPRESSURE_RETRY_AFTER_S=float("inf")) == ids(BACKPRESSURE_RETRY_AFTER_S=float("nan")) \
        == {"composition.E050"}


def test_the_middleware_s_place_is_checked() -> None:
    """First in MIDDLEWARE, its 503s were missing from django-prometheus' HTTP metrics; left out,
    BACKPRESSURE_PATHS refused nothing. Neither was reported."""
    middleware = [path for path in settings.MIDDLEWARE if path != BACKPRESSURE_MIDDLEWARE]
    assert settings.MIDDLEWARE[-1] == BACKPRESSURE_MIDDLEWARE
    assert check_backpressure_settings() == []
    with override_settings(MIDDLEWARE=[BACKPRESSURE_MIDDLEWARE, *middleware]):
        [first] = check_backpressure_settings()
    assert first.id == "composition.W055" and "PrometheusAfterMiddleware" in first.msg
    paths = {**settings.COMPOSITION, "BACKPRESSURE_PATHS": {"/api/invoices": "billing"}}
    with override_settings(MIDDLEWARE=middleware, COMPOSITION=paths):
        assert [message.id for message in check_backpressure_settings()] == ["composition.W054"]
    # By class: the defining module's path is the same middleware (it read as missing).
    with override_settings(MIDDLEWARE=[*middleware, "composition.backpressure.admission.BackpressureMiddleware"]):
        assert check_backpressure_settings() == []


@pytest.mark.django_db
def test_a_frozen_broker_costs_one_timeout_per_reset_period_not_one_per_request(
        throwaway_redis_server: ThrowawayRedis) -> None:
    throwaway_redis_server.freeze()
    with _limits(billing=1000), use_broker(throwaway_redis_server.url):
        began = time.monotonic()
        for _ in range(20):
            admit("billing")  # the outbox is empty and the broker cannot answer: admitted
            backpressure._depths._values.clear()  # force a measurement every time
        took = time.monotonic() - began
    # One broker socket timeout (2 s) opens the breaker; the other 19 measurements skip it.
    assert took < 2 * 2.0 + 1.0, took


@pytest.mark.django_db(transaction=True)
def test_a_depth_the_database_cannot_give_admits_and_is_not_asked_again_on_every_request() -> None:
    # The outbox table locked by another transaction, and a short statement timeout: the count
    # fails as it would against a struggling database. It used to fail the request (a 500) and
    # run again on the next one.
    def lock_the_table() -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {OutboxMessage._meta.db_table} IN ACCESS EXCLUSIVE MODE")

    with HeldInAnotherTransaction(lock_the_table):
        with connection.cursor() as cursor:
            cursor.execute("SHOW statement_timeout")
            before = cursor.fetchone()[0]
            cursor.execute("SET statement_timeout = '200ms'")
        try:
            with override_settings(COMPOSITION={**settings.COMPOSITION, "BACKPRESSURE_QUEUES": {QUEUE: 1},
                                                "BACKPRESSURE_CACHE_S": 30}), capture_logs() as logs:
                admit(QUEUE)  # not measured: admitted
                began = time.monotonic()
                for _ in range(5):
                    admit(QUEUE)
                assert time.monotonic() - began < 0.1  # the failed measurement stands, not re-run
            assert [entry["event"] for entry in logs if entry["log_level"] == "warning"] \
                == ["could not measure the queue's depth; the last measurement stands"]
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SET statement_timeout = %s", [before])
