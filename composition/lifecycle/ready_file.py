"""A process's ready file: its pid, written in one step once the process is up, and removed by
one ``unlink`` (no lock, nothing logged), so that a signal handler may remove it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["ReadyFile"]


class ReadyFile:
    """The ready file at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # A plain string, made before any signal: removing it is one system call.
        self._path = os.fspath(path)

    def write(self) -> None:
        """This process's pid, in one step (a reader never sees it half written)."""
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        partial.write_text(f"{os.getpid()}\n")
        partial.replace(self.path)

    def remove(self) -> None:
        """Remove it if it is there; from the signal handler too."""
        with contextlib.suppress(OSError):
            os.unlink(self._path)
