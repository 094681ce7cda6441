"""The wheel ships the reusable app only: composition with migrations and py.typed."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT


@pytest.mark.slow
def test_wheel_holds_composition_with_migrations_and_not_the_example(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True)
    (wheel,) = tmp_path.glob("django_backend_composition-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "composition/__init__.py" in names
    assert "composition/py.typed" in names
    assert "composition/migrations/0001_initial.py" in names
    assert any(name.startswith("composition/management/commands/runworkers") for name in names)
    assert not [name for name in names if name.split("/")[0] in ("project", "billing", "tests", "bench")]
