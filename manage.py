#!/usr/bin/env python3
"""Django's command-line utility for the example project.

Started by an interpreter without Django (``./manage.py`` runs the system's python3), it runs
itself again in the project's ``.venv``, which ``./run`` and ``make test`` install: the
``./manage.py ...`` lines of the README and of docs/ work as pasted, with no environment to
activate first.
"""

import os
import sys
from pathlib import Path


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    try:
        from django.core.management import execute_from_command_line
    except ModuleNotFoundError as exc:
        if exc.name != "django":
            raise
        python = Path(__file__).resolve().parent / ".venv" / "bin" / "python"
        if python.exists() and not os.environ.get("MANAGE_PY_IN_VENV"):
            os.environ["MANAGE_PY_IN_VENV"] = "1"  # once: a .venv without Django must not loop
            os.execv(python, [str(python), *sys.argv])
        raise SystemExit(f"manage.py: no Django for {sys.executable}, nor in a complete .venv beside "
                         "manage.py: run ./run or `make venv` first") from None
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
