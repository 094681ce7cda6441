"""``health workers``: progress of real worker processes, stale and stuck workers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from composition import health
from composition.health import heartbeats
from composition.lifecycle import pids
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
    # Beating again: on a loaded machine the worker's start and the health commands above can
    # take longer than WORKER_STALE_AFTER_S, and a stale beat is not counted as stuck.
    heartbeats.write_heartbeat(client, elsewhere, {"jobs_in_flight": 1, "oldest_job_started_at": now - 3600,
                                                   "max_job_s": 10})
    code, cluster = _health_workers()
    assert code == 1 and elsewhere in cluster["stuck"], cluster

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
    # Only this project's registered workers count: another project's `runworkers` on the host
    # (a ./run beside the tests) is not this one's.
    down = {"default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{free_port()}/0"}}
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    with override_settings(CACHES=down), \
            subprocess.Popen([*sleep, "manage.py", "runworkers"]) as elsewhere, subprocess.Popen(sleep) as worker:
        try:
            report = health.workers(local=True)
            assert not report.ok and report.detail["heartbeats"] == "unreadable", "no worker of ours runs here"
            pids.register_worker(worker.pid)
            report = health.workers(local=True)
            assert report.ok and report.detail["worker_pids"] == [worker.pid], report.detail
            assert not health.workers().ok, "the cluster view cannot tell, and says so"
            worker.kill()
            worker.wait()
            assert not health.workers(local=True).ok, "its worker died"
        finally:
            pids.unregister_worker(worker.pid)
            worker.kill()
            elsewhere.kill()


def test_a_local_worker_that_runs_without_beating_is_unhealthy_whatever_its_siblings(client: Any) -> None:
    # One of this container's two worker processes frozen (SIGSTOP, or blocked whole): it was
    # neither fresh nor gone, listed nowhere, and the check passed on its sibling.

    frozen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    host = socket.gethostname()
    pids.register_worker(frozen.pid)
    pids.register_worker(os.getpid())
    try:
        with override_settings(COMPOSITION={**settings.COMPOSITION, "WORKER_STALE_AFTER_S": 1.0}):
            heartbeats.write_heartbeat(client, f"{host}:{frozen.pid}", {"jobs_in_flight": 0})
            time.sleep(1.2)
            heartbeats.write_heartbeat(client, f"{host}:{os.getpid()}", {"jobs_in_flight": 0})
            report = health.workers(local=True)
            assert not report.ok
            assert report.detail["stuck"] == [f"{host}:{frozen.pid}"] and report.detail["fresh"] == 1, report.detail
            # Stopped cleanly: withdrawn from the registry as well as from the heartbeats.
            pids.unregister_worker(frozen.pid)
            heartbeats.clear_heartbeat(client, f"{host}:{frozen.pid}")
            assert health.workers(local=True).ok
    finally:
        pids.unregister_worker(frozen.pid)
        pids.unregister_worker(os.getpid())
        frozen.kill()
        frozen.wait()


@contextmanager
def _beside_this_worker(client: Any) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """This host's name and a running process that never beats, with this test process
    registered as a worker of this host (it beats when the test says)."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    host = socket.gethostname()
    pids.register_worker(os.getpid())
    try:
        yield host, other
    finally:
        pids.unregister_worker(other.pid)
        pids.unregister_worker(os.getpid())
        heartbeats.clear_heartbeat(client, f"{host}:{os.getpid()}")
        other.kill()
        other.wait()


def test_a_frozen_local_worker_stays_unhealthy_after_its_stale_record_is_pruned(
        client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A sibling's beat prunes the registry's members after PRUNE_AFTER_STALE_PERIODS stale
    # periods: the frozen worker was then in neither the fresh nor the stale ones, and the
    # check passed on its sibling with a child that will never run a job.
    monkeypatch.setattr(heartbeats, "PRUNE_AFTER_STALE_PERIODS", 2)
    with _beside_this_worker(client) as (host, frozen), \
            override_settings(COMPOSITION={**settings.COMPOSITION, "WORKER_STALE_AFTER_S": 1.0}):
        pids.register_worker(frozen.pid)
        heartbeats.write_heartbeat(client, f"{host}:{frozen.pid}", {"jobs_in_flight": 0})
        time.sleep(2.2)
        heartbeats.write_heartbeat(client, f"{host}:{os.getpid()}", {"jobs_in_flight": 0})
        assert client.zscore(heartbeats.REGISTRY_KEY, f"{host}:{frozen.pid}") is None, "pruned"
        report = health.workers(local=True)
        assert not report.ok
        assert report.detail["stuck"] == [f"{host}:{frozen.pid}"] and report.detail["fresh"] == 1, report.detail


def test_a_local_worker_is_starting_until_a_stale_period_after_it_registered(client: Any) -> None:
    # Registered a moment before its first beat: not frozen then, but frozen once a beat was due
    # and none came (stopped while starting), though it never had a record in Redis to go stale.
    with _beside_this_worker(client) as (host, starting), \
            override_settings(COMPOSITION={**settings.COMPOSITION, "WORKER_STALE_AFTER_S": 1.0}):
        pids.register_worker(starting.pid)
        heartbeats.write_heartbeat(client, f"{host}:{os.getpid()}", {"jobs_in_flight": 0})
        report = health.workers(local=True)
        assert report.ok and report.detail["stuck"] == [], report.detail
        time.sleep(1.2)
        heartbeats.write_heartbeat(client, f"{host}:{os.getpid()}", {"jobs_in_flight": 0})
        report = health.workers(local=True)
        assert not report.ok
        assert report.detail["stuck"] == [f"{host}:{starting.pid}"] and report.detail["fresh"] == 1, report.detail


def test_a_local_check_names_this_host_s_stale_workers(client: Any) -> None:
    # A killed worker whose beat has aged out: neither fresh nor gone any more, and the check
    # failed with nothing listed to say why.

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    pids.register_worker(dead.pid)
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
        pids.unregister_worker(dead.pid)
        heartbeats.clear_heartbeat(client, worker)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_local_check_counts_only_its_own_project_s_workers(client: Any, worker_processes) -> None:  # type: ignore[no-untyped-def]
    # Two checkouts on one host sharing a Redis (here: the same settings under another
    # module, as another checkout's are): each one's `health workers --local` sees its own.
    flush_broker()
    another = "tests.settings_another_checkout"
    ours = worker_processes.spawn(["--threads", "1", "--shutdown-timeout", "10"])
    theirs = worker_processes.spawn(["--threads", "1", "--shutdown-timeout", "10"], DJANGO_SETTINGS_MODULE=another)
    for settings_module, worker in (("tests.settings", ours), (another, theirs)):
        env = subprocess_env(DJANGO_SETTINGS_MODULE=settings_module)

        def local_workers(env: dict[str, str] = env) -> list[str]:
            result = subprocess.run([sys.executable, "manage.py", "health", "workers", "--local", "--json"],
                                    env=env, capture_output=True, text=True, timeout=30)
            return [beat["worker"] for beat in json.loads(result.stdout[result.stdout.index("{"):])["workers"]]

        wait_until(lambda worker=worker, local_workers=local_workers: any(  # type: ignore[misc]
            w.endswith(f":{worker.pid}") for w in local_workers()), 30, interval_s=0.5, message=worker.output())
        assert [w.rpartition(":")[2] for w in local_workers()] == [str(worker.pid)]
    assert {beat["worker"].rpartition(":")[2] for beat in _health_workers()[1]["workers"]} == {
        str(ours.pid), str(theirs.pid)}, "the cluster view has both"
