"""Every ``manage.py`` line in a code block of the README and of the docs runs as pasted.

From a shell that has not activated ``.venv`` (its ``bin`` is off the PATH): none fails to
start (command not found, no Django), none ends in a traceback or a usage error. Two kinds of
block are left out: the install guide's run in a project of their own (``test_install_guide``),
and the README tour's against a real ``./run`` (``test_run_command``), where they act on what
the tour made before them.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from composition.testing import subprocess_env
from tests.helpers import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# What the docs say a command exits with: 0, or 1 when there is nothing to act on (no dead
# letter of that fingerprint, no row of that id) or a check fails. Never 2 (a usage error),
# 126 or 127 (not runnable).
DOCUMENTED_EXITS = (0, 1)
# A command line: maybe a variable or two, then manage.py however it is started.
COMMAND = re.compile(r"^(?:\w+=\S*\s+)*(?:\S*python3?\s+)?(?:\./)?manage\.py\s")


def pasted_commands() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        blocks = re.finditer(r"(<!-- (?:guide|tour):[^>]+ -->\n)?```\w*\n(.*?)```", path.read_text(), re.S)
        for block in blocks:
            if block.group(1):
                continue
            found += [(path.name, line.strip()) for line in block.group(2).splitlines() if COMMAND.match(line)]
    return found


def test_the_docs_have_manage_py_lines_to_paste() -> None:
    commands = pasted_commands()
    assert len(commands) >= 10, commands
    assert all("./manage.py " in line for _, line in commands), "one way to run a command, everywhere"


def _as_a_user_s_shell() -> dict[str, str]:
    env = subprocess_env()
    env.pop("VIRTUAL_ENV", None)
    venv_bin = str(ROOT / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(entry for entry in env["PATH"].split(os.pathsep)
                                  if Path(entry).resolve() != Path(venv_bin).resolve())
    return env


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("doc", "line"), pasted_commands())
def test_a_documented_command_runs_as_pasted(doc: str, line: str) -> None:
    result = subprocess.run(["bash", "-c", line], cwd=ROOT, env=_as_a_user_s_shell(), capture_output=True,
                            text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode in DOCUMENTED_EXITS, f"{doc}: `{line}` exited {result.returncode}:\n{output[-2000:]}"
    assert "Traceback" not in output and "Error:" not in output.replace("CommandError:", ""), f"{doc}: {output[-2000:]}"
