"""Request ids and structured logs."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import structlog
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory

from composition.logging import (
    REQUEST_ID_HEADER,
    RequestIdMiddleware,
    clean_request_id,
    log_thread_deaths,
    logging_config,
)
from composition.testing import free_port, subprocess_env
from tests.helpers import ROOT


def test_well_formed_request_id_is_kept_and_echoed(client: Client) -> None:
    response = client.get("/healthz", HTTP_X_REQUEST_ID="abc-123.def:9")
    assert response[REQUEST_ID_HEADER] == "abc-123.def:9"


@pytest.mark.parametrize("bad", ["", "has space", "new\nline", "trailing\n", "x" * 200, "-leading-dash", "émoji"])
def test_malformed_request_id_is_replaced(client: Client, bad: str) -> None:
    assert clean_request_id(bad) != bad
    assert len(clean_request_id(bad)) == 32


def test_generated_when_absent(client: Client) -> None:
    first = client.get("/healthz")[REQUEST_ID_HEADER]
    second = client.get("/healthz")[REQUEST_ID_HEADER]
    assert len(first) == 32 and first != second


def test_request_id_is_bound_for_the_request_and_cleared_after() -> None:
    seen: dict[str, object] = {}

    def view(request: HttpRequest) -> HttpResponse:
        seen.update(structlog.contextvars.get_contextvars())
        return HttpResponse("ok")

    structlog.contextvars.bind_contextvars(leftover="from an earlier request")
    middleware = RequestIdMiddleware(view)
    response = middleware(RequestFactory().get("/", HTTP_X_REQUEST_ID="req-42"))
    assert seen == {"request_id": "req-42"}
    assert response[REQUEST_ID_HEADER] == "req-42"
    assert structlog.contextvars.get_contextvars() == {}


def _json_handler() -> logging.Handler:
    """A handler formatting as ``logging_config("json")`` does, to stderr."""
    config = logging_config("json", "INFO")
    formatter = config["formatters"]["structlog"]["()"](
        processors=config["formatters"]["structlog"]["processors"],
        foreign_pre_chain=config["formatters"]["structlog"]["foreign_pre_chain"],
    )
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    return handler


def test_json_lines_carry_the_bound_context(capsys: pytest.CaptureFixture[str]) -> None:
    handler = _json_handler()
    logger = logging.getLogger("test.json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        structlog.contextvars.bind_contextvars(request_id="r1", job_id="j1", attempt=2, payment_id=7)
        structlog.get_logger("test.json").info("processing payment receipt job")
    finally:
        structlog.contextvars.clear_contextvars()
        logger.removeHandler(handler)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    record = json.loads(line)
    assert record["event"] == "processing payment receipt job"
    assert (record["request_id"], record["job_id"], record["attempt"], record["payment_id"]) == ("r1", "j1", 2, 7)
    assert record["level"] == "info" and "timestamp" in record
    assert record["pid"] == os.getpid()  # several processes write to one stream


def test_djangos_own_line_for_an_error_answer_carries_the_request_id(client: Client,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # django.request logs a 4xx/5xx after every middleware has returned, when the request id
    # is no longer bound: taken from the request the record names.
    handler = _json_handler()
    logger = logging.getLogger("django.request")
    logger.addHandler(handler)
    try:
        response = client.get("/no/such/page", HTTP_X_REQUEST_ID="req-404")
    finally:
        logger.removeHandler(handler)
    assert response.status_code == 404
    lines = [json.loads(line) for line in capsys.readouterr().err.strip().splitlines() if line.startswith("{")]
    [line] = [line for line in lines if line.get("logger") == "django.request"]
    assert (line["event"], line["request_id"], line["level"]) == ("Not Found: /no/such/page", "req-404", "warning")


def test_lines_others_log_as_errors_that_are_routine_here_are_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    handler = _json_handler()
    config = logging_config("json", "INFO")
    loggers = {name: logging.getLogger(name) for name in ("dramatiq.worker.WorkerThread",
                                                          "django.security.DisallowedHost")}
    filters = {name: config["filters"][config["loggers"][name]["filters"][0]] for name in loggers}
    try:
        for name, logger in loggers.items():
            options = {key: value for key, value in filters[name].items() if key != "()"}
            logger.addFilter(filters[name]["()"](**options))
            logger.addHandler(handler)
            logger.propagate = False
        try:
            raise ValueError("boom")
        except ValueError:
            loggers["dramatiq.worker.WorkerThread"].error("Failed to process message %s with unhandled exception.",
                                                          "m1", exc_info=True)
            loggers["dramatiq.worker.WorkerThread"].error("Something else went wrong", exc_info=True)
            loggers["django.security.DisallowedHost"].error("Invalid HTTP_HOST header: 'evil'.", exc_info=True)
    finally:
        for logger in loggers.values():
            logger.filters.clear()
            logger.removeHandler(handler)
            logger.propagate = True
    lines = [json.loads(line) for line in capsys.readouterr().err.strip().splitlines()]
    assert [(line["level"], "exception" in line) for line in lines] == [
        ("warning", True),  # an attempt that failed: composition says retry (warning) or dead letter (error)
        ("error", True),  # anything else stays what it was
        ("warning", False),  # a scanner's Host header: no traceback
    ]


@pytest.mark.slow
def test_gunicorn_with_the_projects_config_writes_only_json_lines(tmp_path: Path) -> None:
    port = free_port()
    errors = (tmp_path / "gunicorn.err").open("w+b")
    web = subprocess.Popen([sys.executable, "-m", "gunicorn", "project.wsgi:application", "--config",
                            "python:project.gunicorn_conf", "--bind", f"127.0.0.1:{port}", "--workers", "1",
                            "--no-control-socket"],  # not left behind in ~/.gunicorn
                           cwd=ROOT, env=subprocess_env(LOG_FORMAT="json"),
                           stdout=errors, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "gunicorn did not come up"
                time.sleep(0.2)
        bad_host = urllib.request.Request(f"http://127.0.0.1:{port}/healthz", headers={"Host": "evil.example"})
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(bad_host, timeout=5)
    finally:
        web.send_signal(signal.SIGTERM)
        web.wait(30)
    errors.seek(0)
    lines = [line for line in errors.read().decode().splitlines() if line.strip()]
    not_json = []
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            not_json.append(line)
    assert not_json == [], not_json
    assert any(line.get("logger") == "gunicorn.error" and "Booting worker" in line["event"] for line in parsed)
    assert not [line for line in parsed if line.get("logger") == "gunicorn.access"]  # accesslog = None: off
    [host] = [line for line in parsed if line.get("logger") == "django.security.DisallowedHost"]
    assert host["level"] == "warning" and "exception" not in host


def test_a_thread_that_dies_of_an_exception_is_one_critical_line(caplog: pytest.LogCaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Python's default hook wrote the traceback as plain text lines among the JSON ones.
    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)
    log_thread_deaths()
    doomed = threading.Thread(target=lambda: 1 / 0, name="doomed")
    doomed.start()
    doomed.join()
    [record] = [r for r in caplog.records if r.name == "composition.threads"]
    assert record.levelname == "CRITICAL" and record.msg["thread"] == "doomed"
    assert record.msg["exc_info"][0] is ZeroDivisionError  # rendered as the line's "exception"
