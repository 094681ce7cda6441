"""``health workers``: progress of real worker processes, stale and stuck workers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from composition import health, heartbeats
from composition.testing import free_port, subprocess_env, wait_until
from tests.outboxapp.helpers import flush_broker


@pytest.fixture
def client() -> Iterator[Any]:
    connection = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    # Workers SIGKILLed by earlier tests may still look alive for a stale period: start empty.
    connection.delete(heartbeats.REGISTRY_KEY)
    yield connection
    connection.delete(heartbeats.REGISTRY_KEY)
    connection.close()


def _health_workers() -> tuple[int, dict[str, Any]]:
    result = subprocess.run([sys.executable, "manage.py", "health", "workers", "--json"], env=subprocess_env(),
                            capture_output=True, text=True, timeout=30)
    return result.returncode, json.loads(result.stdout[result.stdout.index("{"):])


@pytest.mark.slow
@pytest.mark.version_smoke  # the health command against a real worker, on the new versions
@pytest.mark.django_db(transaction=True)
def test_exit_codes_follow_a_real_worker_process(client: Any, worker_processes) -> None:  # type: ignore[no-untyped-def]
    code, body = _health_workers()
    assert (code, body["fresh"]) == (1, 0)
    # Messages other tests left (nudges, or a killed worker's unacked jobs, which this worker
    # would take back at start) would be jobs in flight when the first beat is read.
    flush_broker()

    worker = worker_processes.spawn(["--threads", "1", "--shutdown-timeout", "10"])
    wait_until(lambda: _health_workers()[0] == 0, 30, interval_s=0.5, message=worker.output())
    code, body = _health_workers()
    (beat,) = body["workers"]
    assert beat["worker"].endswith(f":{worker.pid}")
    assert beat["jobs_in_flight"] == 0 and body["stuck"] == []

    assert worker.terminate(20) == 0
    assert _health_workers()[0] == 1  # a cleanly stopped worker withdraws its heartbeat


def test_stale_and_stuck_workers_are_unhealthy(client: Any) -> None:
    with override_settings(COMPOSITION={**settings.COMPOSITION, "WORKER_STALE_AFTER_S": 1.0,
                                        "WORKER_STUCK_AFTER_S": 60.0}):
        now = time.time()
        heartbeats.write_heartbeat(client, "host:1", {"jobs_in_flight": 0})
        assert health.workers().ok
        # Busy on one job for longer than its time limit, or (no time limit) than WORKER_STUCK_AFTER_S.
        heartbeats.write_heartbeat(client, "host:2", {"jobs_in_flight": 1, "oldest_job_started_at": now - 30,
                                                      "max_job_s": 10})
        heartbeats.write_heartbeat(client, "host:3", {"jobs_in_flight": 1, "oldest_job_started_at": now - 90,
                                                      "max_job_s": None})
        heartbeats.write_heartbeat(client, "host:4", {"jobs_in_flight": 1, "oldest_job_started_at": now - 30,
                                                      "max_job_s": None})
        # Every job against its own limit: a young job far past its 30 s behind an old one
        # well within its hour.
        heartbeats.write_heartbeat(client, "host:5", {"jobs_in_flight": 2, "oldest_job_started_at": now - 1200,
                                                      "max_job_s": 3600, "jobs": [
                                                          {"started_at": now - 1200, "time_limit_s": 3600},
                                                          {"started_at": now - 900, "time_limit_s": 30}]})
        heartbeats.write_heartbeat(client, "host:6", {"jobs_in_flight": 2, "oldest_job_started_at": now - 1200,
                                                      "max_job_s": 3600, "jobs": [
                                                          {"started_at": now - 1200, "time_limit_s": 3600},
                                                          {"started_at": now - 20, "time_limit_s": 30}]})
        report = health.workers()
        assert not report.ok
        assert report.detail["stuck"] == ["host:2", "host:3", "host:5"]
        for worker_id in ("host:2", "host:3", "host:4", "host:5", "host:6"):
            heartbeats.clear_heartbeat(client, worker_id)
        assert health.workers().ok
        time.sleep(1.2)
        report = health.workers()
        assert not report.ok and report.detail["fresh"] == 0


def _health_workers_local() -> tuple[int, dict[str, Any]]:
    result = subprocess.run([sys.executable, "manage.py", "health", "workers", "--local", "--json"],
                            env=subprocess_env(), capture_output=True, text=True, timeout=30)
    return result.returncode, json.loads(result.stdout[result.stdout.index("{"):])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_local_checks_only_this_host_s_processes(client: Any, worker_processes) -> None:  # type: ignore[no-untyped-def]
    import socket

    flush_broker()
    elsewhere = "another-host:4242"
    now = time.time()
    # A stuck worker on another host makes the cluster unhealthy, never this host's container.
    heartbeats.write_heartbeat(client, elsewhere, {"jobs_in_flight": 1, "oldest_job_started_at": now - 3600,
                                                   "max_job_s": 10})
    assert _health_workers_local()[0] == 1  # nothing of this host beats yet

    worker = worker_processes.spawn(["--threads", "1", "--shutdown-timeout", "10"])
    wait_until(lambda: _health_workers_local()[0] == 0, 30, interval_s=0.5, message=worker.output())
    code, body = _health_workers_local()
    assert body["host"] == socket.gethostname()
    assert [beat["worker"] for beat in body["workers"]] == [f"{socket.gethostname()}:{worker.pid}"]
    assert _health_workers()[0] == 1 and elsewhere in _health_workers()[1]["stuck"]

    # This host's workers died (SIGKILL: no withdrawn heartbeat, the beat is still fresh):
    # unhealthy at once, not when the beat expires.
    worker.kill_group()
    code, body = _health_workers_local()
    assert code == 1, body
    assert body["gone"] == [f"{socket.gethostname()}:{worker.pid}"]
    heartbeats.clear_heartbeat(client, elsewhere)


def test_a_container_check_with_the_heartbeats_unreadable_asks_whether_its_workers_run() -> None:
    # The heartbeats live in the cache's Redis; its outage degrades the workers, it does not
    # kill them, and the container's healthcheck must not have working containers restarted.
    down = {"default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{free_port()}/0"}}
    with override_settings(CACHES=down):
        report = health.workers(local=True)
        assert not report.ok and report.detail["heartbeats"] == "unreadable", "no worker runs here"
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "runworkers"])
        try:
            seen: list[Any] = []
            wait_until(lambda: seen.append(health.workers(local=True)) or seen[-1].ok, 10, interval_s=0.2,
                       message="its runworkers process was never counted")
            assert worker.pid in seen[-1].detail["runworkers_pids"], seen[-1].detail
            assert not health.workers().ok, "the cluster view cannot tell, and says so"
        finally:
            worker.kill()
            worker.wait()


def test_a_local_worker_that_runs_without_beating_is_unhealthy_whatever_its_siblings(client: Any) -> None:
    # One of this container's two worker processes frozen (SIGSTOP, or blocked whole): it was
    # neither fresh nor gone, listed nowhere, and the check passed on its sibling.
    import os
    import socket

    frozen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    host = socket.gethostname()
    try:
        with override_settings(COMPOSITION={**settings.COMPOSITION, "WORKER_STALE_AFTER_S": 1.0}):
            heartbeats.write_heartbeat(client, f"{host}:{frozen.pid}", {"jobs_in_flight": 0})
            time.sleep(1.2)
            heartbeats.write_heartbeat(client, f"{host}:{os.getpid()}", {"jobs_in_flight": 0})
            report = health.workers(local=True)
            assert not report.ok
            assert report.detail["stuck"] == [f"{host}:{frozen.pid}"] and report.detail["fresh"] == 1
            heartbeats.clear_heartbeat(client, f"{host}:{frozen.pid}")
            assert health.workers(local=True).ok
    finally:
        frozen.kill()
        frozen.wait()


def test_a_local_check_names_this_host_s_stale_workers(client: Any) -> None:
    # A killed worker whose beat has aged out: neither fresh nor gone any more, and the check
    # failed with nothing listed to say why.
    import socket

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    worker = f"{socket.gethostname()}:{dead.pid}"
    try:
        with override_settings(COMPOSITION={**settings.COMPOSITION, "WORKER_STALE_AFTER_S": 1.0}):
            heartbeats.write_heartbeat(client, worker, {"jobs_in_flight": 0})
            time.sleep(1.2)
            report = health.workers(local=True)
            assert not report.ok
            assert worker in [row["worker"] for row in report.detail["stale"]], report.detail
    finally:
        heartbeats.clear_heartbeat(client, worker)
