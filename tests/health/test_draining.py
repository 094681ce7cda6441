"""The pre-stop step: ``manage.py drain`` marks every web process of the host draining, so
``/readyz`` answers 503 "draining" while gunicorn still serves, before SIGTERM stops it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client, override_settings

from composition.health import checks as health
from composition.lifecycle.processes import ProcessComponent
from composition.testing import free_port, http_status, subprocess_env, wait_until
from tests.helpers import ROOT

pytestmark = pytest.mark.django_db


def _manage(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *argv], cwd=ROOT, env=env or subprocess_env(),
                          capture_output=True, text=True, timeout=60)


def _drain_env(drain_file: Path, wait_s: float) -> dict[str, str]:
    overrides = {"HEALTH_DRAIN_FILE": str(drain_file), "HEALTH_DRAIN_WAIT_S": wait_s}
    return subprocess_env(COMPOSITION_TEST_OVERRIDES=json.dumps(overrides))


def test_the_drain_mark_fails_readiness_in_this_process_and_clear_withdraws_it(
        client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    drain_file = tmp_path / "web.draining"
    health.reset_readiness_cache()
    with override_settings(COMPOSITION={**settings.COMPOSITION, "HEALTH_DRAIN_FILE": str(drain_file)}):
        assert client.get("/readyz").status_code == 200
        began = time.monotonic()
        result = _manage("drain", "--wait", "1.5", env=_drain_env(drain_file, 0))
        assert result.returncode == 0, result.stderr
        assert time.monotonic() - began >= 1.5  # it waited for the load balancers
        with caplog.at_level("ERROR", logger="django.request"):
            response = client.get("/readyz")
        assert (response.status_code, response.json()["draining"]) == (503, True)
        # Not Django's "Service Unavailable" ERROR at every load balancer probe of a drain.
        assert not [record for record in caplog.records if record.name == "django.request"]
        assert client.get("/healthz").status_code == 200  # draining is not dead
        assert _manage("drain", "--clear", env=_drain_env(drain_file, 0)).returncode == 0
        assert not drain_file.exists()
        assert client.get("/readyz").status_code == 200


@pytest.mark.parametrize("wait", ["nan", "inf", "1e300", "-1"])
def test_a_drain_wait_it_cannot_keep_is_refused_before_the_mark_is_written(tmp_path: Path, wait: str) -> None:
    # Written first and then failing, the mark would leave the host draining for good.
    drain_file = tmp_path / "web.draining"
    result = _manage("drain", "--wait", wait, env=_drain_env(drain_file, 0))
    assert result.returncode == 1 and "--wait must be between 0 and" in result.stderr, result.stderr
    assert not drain_file.exists()


def test_an_unwritable_mark_and_a_ctrl_c_during_the_wait_are_said_in_one_line(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    result = _manage("drain", "--wait", "0", env=_drain_env(blocked / "web.draining", 0))
    assert result.returncode == 1 and "could not write the drain mark" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr

    drain_file = tmp_path / "web.draining"
    waiting = subprocess.Popen([sys.executable, "manage.py", "drain", "--wait", "30"], cwd=ROOT,
                               env=_drain_env(drain_file, 0), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert waiting.stdout is not None and waiting.stdout.readline().startswith("draining:")
    waiting.send_signal(signal.SIGINT)
    _, stderr = waiting.communicate(timeout=30)
    assert waiting.returncode == 130 and "still marked draining" in stderr and "drain --clear" in stderr, stderr
    assert "Traceback" not in stderr and drain_file.exists()
    refused = _manage("drain", "--clear", "--wait", "5", env=_drain_env(drain_file, 0))
    assert refused.returncode == 1 and "--clear takes no --wait" in refused.stderr


def test_drain_without_a_drain_file_setting_says_what_to_set() -> None:
    result = _manage("drain", "--wait", "0")
    assert result.returncode == 1
    assert "HEALTH_DRAIN_FILE" in result.stderr


def test_a_negative_drain_setting_is_a_check_error() -> None:
    overrides = json.dumps({"HEALTH_DRAIN_WAIT_S": -1})
    result = _manage("check", env=subprocess_env(COMPOSITION_TEST_OVERRIDES=overrides))
    assert result.returncode != 0
    assert "composition.E009" in result.stderr


def _readyz(base: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{base}/readyz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _slow_request_in_flight(base: str, seconds: int) -> tuple[dict[str, Any], threading.Thread]:
    """A request taking ``seconds``, under way when this returns; its answer lands in the dict
    once the thread is done."""
    slow: dict[str, Any] = {}

    def slow_request() -> None:
        with urllib.request.urlopen(f"{base}/test/slow?seconds={seconds}", timeout=30) as response:
            slow.update(status=response.status, body=json.loads(response.read()))

    requester = threading.Thread(target=slow_request)
    requester.start()
    time.sleep(0.5)  # the slow request is in flight
    return slow, requester


def _stop_while_a_slow_request_runs(base: str, begin_stop: Callable[[], None], serving: Callable[[], bool],
                                    drain_file: Path, *, request_s: int = 6) -> dict[str, Any]:
    """Start a ``request_s`` request, begin the stop, and check the draining window: /readyz
    answers 503 "draining" while the server still serves. Returns the slow request's answer once
    done."""
    slow, requester = _slow_request_in_flight(base, request_s)
    stopper = threading.Thread(target=begin_stop)
    stopper.start()
    wait_until(lambda: _readyz(base)[0] == 503, 10, interval_s=0.1, message="/readyz never answered draining")
    status, body = _readyz(base)
    assert (status, body.get("draining")) == (503, True), body
    assert serving() and drain_file.exists()  # still serving: gunicorn has no SIGTERM yet
    stopper.join(30)
    requester.join(30)
    return slow


@pytest.mark.slow
def test_during_the_pre_stop_step_readyz_is_503_draining_while_a_slow_request_completes(tmp_path: Path) -> None:
    """The supervisor's way (``./run``): a ProcessComponent whose pre-stop step runs ``drain``."""
    drain_file = tmp_path / "web.draining"
    env = _drain_env(drain_file, 3)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    web = ProcessComponent(
        "web", [sys.executable, "-m", "gunicorn", "project.wsgi:application", "--config",
                "python:project.gunicorn_conf", "--bind", f"127.0.0.1:{port}", "--workers", "2", "--no-control-socket"],
        env=env, cwd=str(ROOT), ready_url=f"{base}/readyz",
        pre_stop=lambda: subprocess.run([sys.executable, "manage.py", "drain"], cwd=ROOT, env=env, check=True))
    web.start()
    try:
        slow = _stop_while_a_slow_request_runs(base, web.begin_drain, web.alive, drain_file)
        web.drain(time.monotonic() + 25)
        assert slow == {"status": 200, "body": {"slept_s": 6.0}}
        assert not web.alive()
        assert web.process is not None and web.process.returncode == 0
    finally:
        web.stop(10)


def _sigterms(process: subprocess.Popen[bytes], at_s: tuple[float, ...]) -> None:
    began = time.monotonic()
    for moment in at_s:
        time.sleep(max(0.0, began + moment - time.monotonic()))
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)


@pytest.mark.slow
# Again: once gunicorn has its SIGTERM (after the 3 s draining window and drain's start-up) and
# is finishing a 14 s request.
@pytest.mark.parametrize(("sigterms_at_s", "request_s"), [((0.0,), 6), ((0.0, 7.0), 14)], ids=["once", "again"])
def test_the_container_entrypoint_drains_on_sigterm_before_gunicorn_stops(
        tmp_path: Path, sigterms_at_s: tuple[float, ...], request_s: int) -> None:
    """The image's command (docker/web-entrypoint.sh), sent SIGTERM as ``docker stop`` does; a
    SIGTERM again is the same stop: the script exited 143 while gunicorn still served, which as
    a container's PID 1 kills gunicorn and its requests."""
    drain_file = tmp_path / "web.draining"
    drain_file.write_text("left by an earlier life of the container\n")  # the entrypoint clears it
    port = free_port()
    env = _drain_env(drain_file, 3)
    # HOME: gunicorn's control socket goes under ~/.gunicorn, which the test must not leave behind.
    env.update(PORT=str(port), PATH=f"{Path(sys.executable).parent}:{env['PATH']}", HOME=str(tmp_path))
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(["sh", "docker/web-entrypoint.sh"], cwd=ROOT, env=env, start_new_session=True)
    try:
        wait_until(lambda: http_status(f"{base}/readyz") == 200, 60, interval_s=0.2,
                   message="the entrypoint's gunicorn never became ready")
        slow = _stop_while_a_slow_request_runs(base, lambda: _sigterms(process, sigterms_at_s),
                                               lambda: process.poll() is None, drain_file, request_s=request_s)
        assert process.wait(30) == 0
        assert slow == {"status": 200, "body": {"slept_s": float(request_s)}}
        assert http_status(f"{base}/readyz") == 0  # gone
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.mark.slow
def test_once_gunicorn_stops_a_new_connection_is_refused_at_once_while_requests_in_flight_finish() -> None:
    """After SIGTERM, a client that still comes (a load balancer not caught up yet) is refused
    and can go elsewhere, rather than hang in the listen backlog until the last in-flight
    request ends and be reset then (composition.gunicorn.ThreadWorker)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    web = ProcessComponent(
        "web", [sys.executable, "-m", "gunicorn", "project.wsgi:application", "--config",
                "python:project.gunicorn_conf", "--bind", f"127.0.0.1:{port}", "--workers", "2", "--no-control-socket"],
        env=subprocess_env(), cwd=str(ROOT), ready_url=f"{base}/readyz")
    web.start()
    try:
        slow, requester = _slow_request_in_flight(base, 5)
        assert web.process is not None
        web.process.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # the workers have begun their graceful stop
        assert web.alive()  # still finishing the slow request
        began = time.monotonic()
        with pytest.raises(urllib.error.URLError) as refused:
            urllib.request.urlopen(f"{base}/healthz", timeout=3).close()
        assert isinstance(refused.value.reason, ConnectionRefusedError), refused.value
        assert time.monotonic() - began < 1.0
        requester.join(30)
        assert slow == {"status": 200, "body": {"slept_s": 5.0}}
        web.drain(time.monotonic() + 20)
        assert web.process.returncode == 0
    finally:
        web.stop(10)
