"""The compose file gives each container its own multiprocess directory, every worker container
serves /metrics, and Prometheus scrapes web and every worker replica. Docker cannot run in the
test environment, so the files are checked as data."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import ROOT

yaml = pytest.importorskip("yaml")

DOCKER = ROOT / "docker"
MULTIPROC_DIR = "/tmp/prometheus"


def _load(name: str) -> Any:
    return yaml.safe_load((DOCKER / name).read_text())


def _metrics_port(command: list[str]) -> int:
    assert "--metrics-port" in command, command
    return int(command[command.index("--metrics-port") + 1])


def test_each_container_has_its_own_multiprocess_directory() -> None:
    compose = _load("compose.yaml")
    assert "metrics" not in (compose.get("volumes") or {}), "no volume shared between containers"
    for name in ("web", "worker"):
        service = compose["services"][name]
        mounts = [str(volume) for volume in service.get("volumes") or []]
        assert not [mount for mount in mounts if MULTIPROC_DIR in mount], f"{name} mounts a shared directory"
        assert MULTIPROC_DIR in service.get("tmpfs", []), f"{name} has no private {MULTIPROC_DIR}"


def test_prometheus_scrapes_web_and_every_worker_replica() -> None:
    compose = _load("compose.yaml")
    worker_port = _metrics_port(compose["services"]["worker"]["command"])
    targets = set()
    for job in _load("prometheus.yml")["scrape_configs"]:
        assert job.get("metrics_path", "/metrics") == "/metrics"
        # DNS discovery on the service name answers every replica's address, not just one.
        for config in job.get("dns_sd_configs", []):
            targets |= {(name, config["port"]) for name in config["names"]}
    assert targets == {("web", 8000), ("worker", worker_port)}


def test_the_worker_healthcheck_asks_the_metrics_port_and_fails_on_503_or_no_answer() -> None:
    """The check is the supervisor's /health/workers (a Redis round trip), not manage.py's (a
    second of CPU at every probe): run as written against a server answering 200, then 503,
    then against nothing, with the container's METRICS_TOKEN sent as a bearer token."""
    import http.server
    import subprocess
    import sys
    import threading

    from composition.testing import free_port

    compose = _load("compose.yaml")["services"]["worker"]
    command = compose["healthcheck"]["test"]
    assert command[0] == "CMD" and "/health/workers" in command[-1]
    port = _metrics_port(compose["command"])
    assert f"127.0.0.1:{port}/health/workers" in command[-1]
    answers: list[int] = []
    seen: list[str | None] = []

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(answers[0] if self.path == "/health/workers" else 404)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    local = free_port()
    server = http.server.HTTPServer(("127.0.0.1", local), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    script = command[-1].replace(f":{port}/", f":{local}/")
    try:
        for status, exit_code in ((200, 0), (503, 1)):
            answers[:] = [status]
            done = subprocess.run([sys.executable, *command[2:-1], script], env={"METRICS_TOKEN": "s3cret"},
                                  capture_output=True, text=True, timeout=30)
            assert done.returncode == exit_code, done.stderr[-2000:]
        assert seen == ["Bearer s3cret", "Bearer s3cret"]
    finally:
        server.shutdown()
        server.server_close()
    nothing = subprocess.run([sys.executable, *command[2:-1], script], capture_output=True, text=True, timeout=30)
    assert nothing.returncode == 1 and "Connection refused" in nothing.stderr
