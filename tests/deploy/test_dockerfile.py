"""The image's static files step works as the Dockerfile writes it. No Docker engine runs here, so
the build step is replayed as the image runs it: the files the Dockerfile copies, and nothing
else, in a folder of their own, then its ``collectstatic`` line with its own dummy service URLs
(the settings must import without reaching a server or starting embedded ones)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT

DOCKERFILE = ROOT / "docker" / "Dockerfile"


def _copied_paths() -> list[str]:
    """What the Dockerfile's COPY lines put into /app (sources relative to the repository)."""
    paths = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            *sources, _destination = line.split()[1:]
            paths += sources
    return paths


def _collectstatic_step() -> str:
    """The RUN step that collects static files, its continuation lines joined."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    steps = [line[len("RUN "):] for line in text.splitlines() if line.startswith("RUN ") and "collectstatic" in line]
    assert len(steps) == 1, f"expected one collectstatic step in {DOCKERFILE}, found {steps}"
    return steps[0]


def test_the_image_build_step_collects_the_admin_static_files_without_any_server(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    for source in _copied_paths():
        src = ROOT / source
        if src.is_dir():
            shutil.copytree(src, app / src.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, app / src.name)
    assert (app / "manage.py").exists() and not (app / "tests").exists()

    step = _collectstatic_step()
    static_root = tmp_path / "static"
    # The step's own STATIC_ROOT (/app/static) points into this test's folder instead.
    step = re.sub(r"STATIC_ROOT=\S+", f"STATIC_ROOT={shlex.quote(str(static_root))}", step)
    step = step.replace("python ", f"{shlex.quote(sys.executable)} ", 1)
    # Only what the image has: no service URLs or data folder from this test run's environment.
    env = {key: value for key, value in os.environ.items()
           if not key.endswith("_URL") and key not in {"COMPOSITION_DATA_DIR", "DJANGO_SETTINGS_MODULE"}}
    env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path / "prometheus")
    result = subprocess.run(["sh", "-c", step], cwd=app, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (static_root / "admin" / "css" / "base.css").exists()
    assert "embedded" not in result.stdout + result.stderr, "the build step started embedded servers"
    assert not (app / ".data").exists(), "the build step made a data folder"
