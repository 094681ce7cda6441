"""The gate itself: what `make test` runs without any service URL set."""

from __future__ import annotations

import re
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


def _matrix_tests() -> list[str]:
    """The Makefile's ``MATRIX_TESTS``: the paths the matrix cell runs."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith("MATRIX_TESTS :=")]
    return line.split(":=", 1)[1].split()


def test_the_matrix_cell_lists_paths_that_exist_and_every_file_with_a_version_smoke_test() -> None:
    listed = _matrix_tests()
    assert listed and [path for path in listed if not (ROOT / path).exists()] == []

    def on_the_list(path: str) -> bool:
        return any(path == entry or path.startswith(entry.rstrip("/") + "/") for entry in listed)

    # A version_smoke test in a file the matrix cell never opens would promise a run that never happens.
    smoke = re.compile(r"^(@pytest\.mark\.version_smoke\b|pytestmark = .*\bpytest\.mark\.version_smoke\b)", re.M)
    marked = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
                    if smoke.search(path.read_text()))
    assert marked and [path for path in marked if not on_the_list(path)] == []
