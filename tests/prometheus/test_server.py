"""``runworkers`` serves /metrics with its job counters and sampled gauges (every family the
catalogue leaves to it), and a supervisor archives its children's files when they exit: real
worker processes, a real broker, a real scrape."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from billing.jobs import send_invoice_reminder
from composition.broker.configured import configured_broker
from composition.db.budget import connections_per_process
from composition.lifecycle.workers import BACKGROUND_DB_THREADS, SCHEDULER_DB_THREADS
from composition.prometheus import LockedMultiProcessCollector
from composition.prometheus.directory import process_files
from composition.testing import free_port, wait_until
from tests.jobsapp import jobs
from tests.metrics_catalogue import RUNWORKERS_ONLY

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.empty_queues(jobs.NOOP_QUEUE)]

TOKEN = "worker-scrape-token"
QUEUE = jobs.NOOP_QUEUE


def _scrape(port: int, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


def _noop_successes(text: str) -> float:
    """composition_jobs_total of the noop job's successes in a scrape (0 when absent)."""
    match = re.search(r'^composition_jobs_total\{actor="[^"]*noop",outcome="success"\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def _started(output: str) -> list[str]:
    names = []
    for line in output.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "component started":
            names.append(record["component"])
    return names


def test_runworkers_serves_its_job_counters_on_the_metrics_port(
        worker_processes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    worker = worker_processes.spawn(["--threads", "2", "--queues", QUEUE, "--metrics-port", str(port)],
                                    PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    wait_until(lambda: "workers" in _started(worker.output()), 30,
               message=f"runworkers did not start:\n{worker.output()[-3000:]}")
    assert _started(worker.output())[:3] == ["logging", "metrics", "metrics-server"]
    for _ in range(5):
        jobs.noop.send()

    wait_until(lambda: _noop_successes(_scrape(port)[1]) == 5, 30,
               message=f"no job counters on /metrics:\n{_scrape(port)[1][-2000:]}")
    status, text = _scrape(port)
    assert status == 200
    assert "composition_job_duration_seconds_bucket" in text
    assert "composition_worker_heartbeat_timestamp_seconds" in text
    assert worker.terminate() == 0
    assert _scrape(port)[0] == 0  # the port is closed with the process


def _health(port: int, token: str | None = None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/health/workers",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, json.loads(body) if exc.headers.get("Content-Type") == "application/json" else {}
    except OSError:
        return 0, {}


def test_the_metrics_port_answers_the_host_s_worker_check_and_a_frozen_child_fails_it(
        worker_processes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    supervisor = worker_processes.spawn(
        ["--processes", "2", "--threads", "1", "--queues", QUEUE, "--metrics-port", str(port)],
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path),
        COMPOSITION_TEST_OVERRIDES=json.dumps({"METRICS_TOKEN": TOKEN, "WORKER_HEARTBEAT_S": 0.5,
                                               "WORKER_STALE_AFTER_S": 2.0}))
    wait_until(lambda: _health(port, TOKEN)[0] == 200 and _health(port, TOKEN)[1]["fresh"] >= 2, 60,
               message=f"no healthy /health/workers:\n{_health(port, TOKEN)}\n{supervisor.output()[-3000:]}")
    assert _health(port)[0] == 401, "behind the metrics access policy, as /metrics is"
    host = socket.gethostname()
    children = {beat["worker"] for beat in _health(port, TOKEN)[1]["workers"]} - {f"{host}:{supervisor.pid}"}
    frozen = sorted(children)[0]
    os.kill(int(frozen.rpartition(":")[2]), signal.SIGSTOP)
    try:
        # The child's own server is not the one answering: the supervisor's tells it is frozen.
        wait_until(lambda: _health(port, TOKEN)[0] == 503, 30, message=f"still healthy: {_health(port, TOKEN)}")
        status, body = _health(port, TOKEN)
        assert (status, body["status"], body["stuck"]) == (503, "fail", [frozen]), body
    finally:
        os.kill(int(frozen.rpartition(":")[2]), signal.SIGCONT)
    wait_until(lambda: _health(port, TOKEN)[0] == 200, 30, message=f"not healthy again: {_health(port, TOKEN)}")
    assert supervisor.terminate() == 0, supervisor.output()[-6000:]
    assert _health(port, TOKEN)[0] == 0, "the port is closed with the process"


def test_a_supervisor_serves_every_child_and_archives_each_one_it_reaps(
        worker_processes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    supervisor = worker_processes.spawn(
        ["--processes", "2", "--threads", "2", "--queues", QUEUE, "--metrics-port", str(port)],
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path), COMPOSITION_TEST_OVERRIDES=json.dumps({"METRICS_TOKEN": TOKEN}))
    wait_until(lambda: _scrape(port, TOKEN)[0] == 200, 30,
               message=f"no metrics server:\n{supervisor.output()[-3000:]}")
    assert _scrape(port)[0] == 401
    for _ in range(8):
        jobs.noop.send()
    wait_until(lambda: _noop_successes(_scrape(port, TOKEN)[1]) == 8, 30,
               message=f"no job counters on /metrics:\n{_scrape(port, TOKEN)[1][-2000:]}")
    # Any kind of file: one child may have run all eight jobs (and so be the only one with
    # counters), but each sets its gauges (its heartbeat) from the start.
    children = {f.pid for f in process_files(tmp_path)} - {supervisor.pid}
    assert len(children) == 2, "each child writes its own files"

    assert supervisor.terminate() == 0, supervisor.output()[-6000:]

    # Each child's files went into the archive as it was reaped: only the supervisor's are left.
    assert {f.pid for f in process_files(tmp_path)} <= {supervisor.pid}
    assert (tmp_path / "counter_archive.db").exists()
    registry = CollectorRegistry()
    registry.register(LockedMultiProcessCollector(tmp_path))
    totals = {sample.labels["actor"]: sample.value for metric in registry.collect() for sample in metric.samples
              if sample.name == "composition_jobs_total" and sample.labels["outcome"] == "success"}
    assert [value for actor, value in totals.items() if actor.endswith("noop")] == [8.0]


# What runworkers' metrics sampler sets (beside RUNWORKERS_ONLY's budget): the web scrape in
# core/test_metrics.py gets these from an in-process sample(), this test from the real one.
SAMPLED = ("composition_queue_depth_messages", "composition_broker_messages",
           "composition_broker_oldest_message_age_seconds", "composition_db_connections_in_use",
           "composition_db_connections_max", "composition_db_deadlocks_detected", "composition_dead_letters_open",
           "composition_outbox_pending_messages", "composition_outbox_oldest_pending_age_seconds")
REMINDERS = "reminders"  # billing's send_invoice_reminder queue


@pytest.fixture
def sampled_queues() -> Iterator[None]:
    broker = configured_broker()
    for queue in (QUEUE, jobs.TIME_LIMIT_QUEUE, REMINDERS):
        broker.flush(queue)
    yield
    for queue in (QUEUE, jobs.TIME_LIMIT_QUEUE, REMINDERS):
        broker.flush(queue)


def _samples(text: str) -> dict[str, list[Sample]]:
    """A scrape's samples by family (prometheus_client's parser: a counter's family drops ``_total``)."""
    return {family.name: list(family.samples) for family in text_string_to_metric_families(text)}


def _value(samples: dict[str, list[Sample]], name: str, **labels: str) -> float | None:
    """The sum of the samples called ``name`` whose labels include ``labels``; None when none is."""
    values = [sample.value for family in samples.values() for sample in family
              if sample.name == name and all(sample.labels.get(key) == wanted for key, wanted in labels.items())]
    return sum(values) if values else None


def _family(name: str) -> str:
    """The parser's family name: a counter's without ``_total``."""
    return name.removesuffix("_total")


def test_a_runworkers_scrape_holds_the_families_only_runworkers_sets_and_its_sampled_gauges(
        worker_processes, sampled_queues: None, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    threads = 2
    worker = worker_processes.spawn(
        ["--threads", str(threads), "--queues", f"{QUEUE},{jobs.TIME_LIMIT_QUEUE},{REMINDERS}",
         "--metrics-port", str(port)],
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path),
        COMPOSITION_TEST_OVERRIDES=json.dumps({"METRICS_SAMPLE_INTERVAL_S": 0.3}))  # sampled soon after the jobs
    wait_until(lambda: "workers" in _started(worker.output()), 30,
               message=f"runworkers did not start:\n{worker.output()[-3000:]}")
    jobs.noop.send()
    jobs.overruns.send(key="catalogue-overrun", run_s=10)  # two runs of a 1 s limit, then a dead letter
    send_invoice_reminder.send(invoice_id=0)  # no such invoice: skipped

    def scrape() -> dict[str, list[Sample]]:
        return _samples(_scrape(port)[1])

    def settled(samples: dict[str, list[Sample]]) -> bool:
        # The dead letter is in, and a sampling round after it has run.
        return (_value(samples, "composition_job_timeouts_total", actor="overruns") == 2
                and _value(samples, "composition_dead_letters_open", actor="overruns") == 1
                and _value(samples, "billing_invoice_reminders_total", outcome="skipped") == 1)

    wait_until(lambda: settled(scrape()), 30, message=f"the jobs' figures never showed:\n{_scrape(port)[1][-3000:]}")
    samples = scrape()
    unsampled = [name for name in (*RUNWORKERS_ONLY, *SAMPLED)
                 if name != "composition_component_stop_seconds" and not samples.get(_family(name))]
    assert unsampled == [], "runworkers' scrape has no sample of these"
    assert _value(samples, "composition_jobs_total", actor="noop", outcome="success") == 1
    assert _value(samples, "composition_jobs_total", actor="overruns", outcome="dead") == 1
    assert _value(samples, "composition_job_duration_seconds_count", actor="overruns") == 2
    assert _value(samples, "composition_jobs_in_progress", actor="overruns") == 0  # set, and back to 0
    assert _value(samples, "composition_component_start_seconds_count", component="metrics-sampler") == 1
    # The sampled gauges are this system's readings.
    assert _value(samples, "composition_db_connection_budget", role="worker") == \
        connections_per_process(threads, BACKGROUND_DB_THREADS + SCHEDULER_DB_THREADS)
    assert (_value(samples, "composition_db_connections_in_use") or 0) >= 1  # the sampler's own at least
    assert (_value(samples, "composition_db_connections_max") or 0) > 0
    assert _value(samples, "composition_db_deadlocks_detected") is not None
    for queue in (QUEUE, jobs.TIME_LIMIT_QUEUE, REMINDERS):
        assert _value(samples, "composition_queue_depth_messages", queue=queue) == 0, queue  # all run
        assert _value(samples, "composition_broker_messages", queue=queue, state="ready") == 0, queue
        assert _value(samples, "composition_broker_oldest_message_age_seconds", queue=queue) == 0, queue

    assert worker.terminate() == 0
    # A component's stop is timed as the process drains, after its last scrape: its files hold it.
    registry = CollectorRegistry()
    registry.register(LockedMultiProcessCollector(tmp_path))
    stopped = {sample.labels["component"] for metric in registry.collect() for sample in metric.samples
               if sample.name == "composition_component_stop_seconds_count" and sample.value >= 1}
    assert {"metrics-sampler", "heartbeat", "metrics-server"} <= stopped


def test_the_health_answer_names_no_host_of_an_unreachable_redis(settings) -> None:  # type: ignore[no-untyped-def]
    """/health/workers is served as public=True (open by default): a driver's message naming
    the cache Redis' host and port stays in the log, as /readyz keeps its errors to their kind."""
    from functools import partial

    from composition import health
    from composition.prometheus.access import MetricsAccess
    from composition.prometheus.server import MetricsServerComponent

    closed = free_port()
    settings.CACHES = {**settings.CACHES, "default": {**settings.CACHES["default"],
                                                      "LOCATION": f"redis://127.0.0.1:{closed}/0"}}
    server = MetricsServerComponent(0, address="127.0.0.1", registry=CollectorRegistry(), access=MetricsAccess,
                                    health=partial(health.workers, local=True))
    server.start()
    try:
        body = json.dumps(_health(server.port)[1])
    finally:
        server.stop(5)
    assert "unreadable" in body, body
    assert "127.0.0.1" not in body and str(closed) not in body, body
