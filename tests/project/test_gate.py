"""The gate itself: what `make test` runs without any service URL set."""

from __future__ import annotations

import subprocess
import sys

import pytest

from composition.testing import subprocess_env
from tests.helpers import ROOT


@pytest.mark.rabbitmq
def test_rabbitmq_tests_run_without_rabbitmq_url_when_rabbitmq_listens() -> None:
    env = {key: value for key, value in subprocess_env().items() if key not in ("RABBITMQ_URL", "CI")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
         "tests/broker/test_rabbitmq.py::test_readiness_probes_rabbitmq_up_and_down"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert "1 passed" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    assert "skipped" not in result.stdout
