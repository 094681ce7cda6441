"""Backpressure against real PostgreSQL and Redis, and the circuit breaker's state machine."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import transaction
from django.http import HttpResponse
from django.test import Client, RequestFactory, override_settings

from composition.backpressure import admission as backpressure
from composition.backpressure.admission import (
    Backpressure,
    BackpressureMiddleware,
    admit,
)
from composition.backpressure.depth import queue_depth
from composition.breaker import CircuitBreaker, CircuitOpen
from composition.broker.configured import configured_broker
from composition.checks import check_backpressure_settings
from composition.jobs import TransientError
from composition.outbox import publish
from composition.outbox.relay import Relay
from composition.testing import ThrowawayRedis, use_broker, wait_until
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
    admit("a-queue-without-limit")


@pytest.fixture
def empty_billing_queue() -> Iterator[None]:
    from composition.broker.configured import configured_broker

    configured_broker().flush("billing")
    yield
    configured_broker().flush("billing")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nudge_only", "empty_billing_queue")
def test_middleware_sheds_unsafe_requests_with_503_and_retry_after(api_client: Client,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    client = api_client
    with transaction.atomic():
        publish("send_payment_receipt", {"payment_id": 1})
    overrides = {**settings.COMPOSITION, "BACKPRESSURE_QUEUES": {"billing": 1},
                 "BACKPRESSURE_PATHS": {"/api/invoices": "billing"}, "BACKPRESSURE_CACHE_S": 0.001}
    with override_settings(COMPOSITION=overrides):
        response = client.post("/api/invoices", data=json.dumps({"number": "X", "customer": "c", "amount_cents": 5}),
                               content_type="application/json")
        assert response.status_code == 503
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
    created = client.post("/api/invoices", data=json.dumps({"number": "X", "customer": "c", "amount_cents": 5}),
                          content_type="application/json")
    assert created.status_code == 201


def test_backpressure_settings_are_checked() -> None:
    def ids(**composition: object) -> set[str]:
        with override_settings(COMPOSITION={**settings.COMPOSITION, **composition}):
            return {message.id for message in check_backpressure_settings()}

    assert ids() == set()
    assert ids(BACKPRESSURE_QUEUES={"billing": 0}) == {"composition.E051"}
    assert ids(BACKPRESSURE_PATHS={"api": "q"}) == {"composition.E052"}
    assert ids(BACKPRESSURE_PATHS={"/api": "unlimited"}) == {"composition.W050"}
    assert ids(BACKPRESSURE_RETRY_AFTER_S=0) == {"composition.E050"}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_circuit_opens_after_the_threshold_and_half_opens_after_the_timeout() -> None:
    clock = Clock()
    breaker = CircuitBreaker("payments-api", failure_threshold=3, reset_timeout_s=10, clock=clock)
    calls: list[str] = []

    def failing() -> None:
        calls.append("called")
        raise ConnectionError("down")

    for _ in range(3):
        with pytest.raises(ConnectionError):
            breaker.call(failing)
    assert breaker.state == "open"
    with pytest.raises(CircuitOpen) as caught:
        breaker.call(failing)
    assert isinstance(caught.value, TransientError)  # a job hitting it retries later
    assert len(calls) == 3 and caught.value.retry_after_s == pytest.approx(10)

    clock.now += 10
    assert breaker.state == "half_open"
    with pytest.raises(ConnectionError):
        breaker.call(failing)  # the one trial fails: open again, for a full period
    assert breaker.state == "open"
    clock.now += 10
    assert breaker.call(lambda: "ok") == "ok"
    assert breaker.state == "closed"


def test_half_open_lets_only_the_allowed_trial_calls_through() -> None:
    clock = Clock()
    breaker = CircuitBreaker("slow", failure_threshold=1, reset_timeout_s=1, half_open_max_calls=1, clock=clock)
    with pytest.raises(ValueError), breaker:
        raise ValueError("boom")
    clock.now += 1
    inside = threading.Event()
    release = threading.Event()
    results: list[str] = []

    def trial() -> None:
        def slow() -> str:
            inside.set()
            release.wait(5)
            return "ok"

        results.append(breaker.call(slow))

    thread = threading.Thread(target=trial)
    thread.start()
    inside.wait(5)
    with pytest.raises(CircuitOpen):
        breaker.call(lambda: "second trial")
    release.set()
    thread.join(5)
    assert results == ["ok"] and breaker.state == "closed"


def test_only_failure_types_count_and_successes_reset_the_count() -> None:
    breaker = CircuitBreaker("picky", failure_threshold=2, reset_timeout_s=1, failure_types=(ConnectionError,))
    for _ in range(5):
        with pytest.raises(KeyError):
            breaker.call(lambda: {}["missing"])
    assert breaker.state == "closed"
    with pytest.raises(ConnectionError):
        breaker.call(_raise_connection_error)
    breaker.call(lambda: None)
    with pytest.raises(ConnectionError):
        breaker.call(_raise_connection_error)
    assert breaker.state == "closed"  # never two failures in a row

    @breaker
    def decorated() -> str:
        """Docstring kept."""
        return "x"

    assert decorated() == "x" and decorated.__doc__ == "Docstring kept."
    with pytest.raises(ValueError):
        CircuitBreaker("bad", failure_threshold=0, reset_timeout_s=1)


def _raise_connection_error() -> None:
    raise ConnectionError("refused")


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


def test_with_a_probe_only_the_probe_closes_the_circuit_and_callers_never_wait_for_it() -> None:
    clock = Clock()
    started, release = threading.Event(), threading.Event()
    outcomes: list[bool] = [False, True]  # the first probe fails, the second succeeds
    probes: list[str] = []

    def probe() -> None:
        probes.append("probe")
        started.set()
        release.wait(5)
        if not outcomes.pop(0):
            raise ConnectionError("still down")

    breaker = CircuitBreaker("with-probe", failure_threshold=2, reset_timeout_s=10, clock=clock, probe=probe)
    assert breaker.allow()
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.is_open and not breaker.allow()
    breaker.record_success()  # a call let through before it opened: no trial, still open
    assert breaker.state == "open"

    clock.now += 10
    assert breaker.state == "open"  # reading the state starts nothing
    assert not breaker.allow()  # starts the probe in the background; this caller is refused
    assert started.wait(5) and breaker.state == "half_open"
    with pytest.raises(CircuitOpen):
        breaker.call(lambda: "no trial calls")
    release.set()
    wait_until(lambda: breaker.state == "open", 5, message="the failed probe did not reopen it")
    assert not breaker.allow()  # a full period again

    started.clear()
    clock.now += 10
    assert not breaker.allow()
    wait_until(lambda: breaker.state == "closed", 5, message="the successful probe did not close it")
    assert probes == ["probe", "probe"]
    assert breaker.allow() and not breaker.is_open
    assert breaker.call(lambda: "ok") == "ok"
