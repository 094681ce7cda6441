"""The README's run command on embedded servers: ready within 60 s, Ctrl-C stops it in order."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from composition.testing import free_port, http_status

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow




def test_run_command_serves_readyz_on_embedded_servers_and_ctrl_c_stops_in_reverse(tmp_path: Path) -> None:
    port = free_port()
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "REDIS_URL", "BROKER_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(COMPOSITION_DATA_DIR=str(tmp_path), PORT=str(port), LOG_FORMAT="json")
    log_path = tmp_path / "run.log"
    with log_path.open("wb") as log:
        # Its own process group, like a shell's foreground job: Ctrl-C reaches the whole group.
        process = subprocess.Popen(["./run"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while http_status(f"http://127.0.0.1:{port}/readyz") != 200:
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "not ready within 60 s:\n" + log_path.read_text()
            time.sleep(0.25)
        assert http_status(f"http://127.0.0.1:{port}/healthz") == 200
        # The admin is styled: its static files are collected and served (DEBUG is off).
        assert http_status(f"http://127.0.0.1:{port}/static/admin/css/base.css") == 200
        # Multiprocess metrics: the web's /metrics also shows what the worker process wrote.
        def metrics() -> bytes:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                return bytes(response.read())

        deadline = time.monotonic() + 15
        while b"composition_worker_heartbeat_timestamp_seconds " not in metrics():
            assert time.monotonic() < deadline, metrics().decode()[:3000]
            time.sleep(0.25)
        assert b"django_http_requests_total" in metrics()

        os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        code = process.wait(60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    output = log_path.read_text()
    assert code == 0, output
    assert "using embedded services" not in output  # the launcher owns them; children reuse
    started, stopped = [], []
    for line in output.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("logger") != "composition.system":
            continue
        if record["event"] == "component started":
            started.append(record["component"])
        elif record["event"] in ("component stopped", "component did not stop cleanly"):
            stopped.append((record["component"], record["status"]))
    # The launcher's own components, then the worker process's (interleaved lines are filtered
    # by the launcher's names).
    launcher = ["embedded-postgres", "embedded-valkey", "migrations", "workers", "web"]
    assert [name for name in started if name in launcher][:3] == launcher[:3]
    own_stops = [entry for entry in stopped if entry[0] in ("web", "migrations") or entry[0].startswith("embedded")]
    assert own_stops == [("web", "stopped"), ("migrations", "stopped"), ("embedded-valkey", "stopped"),
                         ("embedded-postgres", "stopped")], output
    assert stopped[-2:] == [("embedded-valkey", "stopped"), ("embedded-postgres", "stopped")]
