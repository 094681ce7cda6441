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


def test_the_worker_healthcheck_leaves_no_metric_files_in_the_container_s_directory(tmp_path: Any) -> None:
    # Run every 15 s, each check's process left its files there: 8,000 a day slowed every scrape.
    import os
    import subprocess
    import sys

    from composition.testing import subprocess_env

    command = _load("compose.yaml")["services"]["worker"]["healthcheck"]["test"]
    assert command[0] == "CMD"
    command = [sys.executable if part == "python" else part for part in command[1:]]
    directory = tmp_path / "prometheus"
    directory.mkdir()
    env = {**subprocess_env(), "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: no worker of this project runs here
    assert done.stdout.startswith("workers: "), done.stdout  # the check ran
    assert os.listdir(directory) == []
