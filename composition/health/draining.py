"""Draining: a process that is going away answers readiness 503 ``"draining"`` first, so load
balancers stop sending it work before it stops listening.

``set_draining()`` marks this process (the worker system's first signal); the drain file
(``HEALTH_DRAIN_FILE``, written by ``manage.py drain``) marks every process of a host, because
gunicorn closes its listeners before it signals its workers. The server's start clears the file,
so a restarted container is not born draining.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from composition.conf import conf

__all__ = ["clear_drain_file", "drain_file", "is_draining", "mark_drain_file", "set_draining"]

_draining = threading.Event()


def set_draining(value: bool = True) -> None:
    """Mark this process as draining (or not): readiness fails while it is."""
    if value:
        _draining.set()
    else:
        _draining.clear()


def drain_file() -> Path | None:
    """The configured drain file, or None when the host-wide marker is off."""
    path = conf.HEALTH_DRAIN_FILE
    return Path(path) if path else None


def is_draining() -> bool:
    """True once this process, or the host through the drain file, is draining."""
    if _draining.is_set():
        return True
    path = drain_file()
    return path is not None and path.exists()


def mark_drain_file(path: Path) -> None:
    """Create the drain file (and its folder); its content says since when, for an operator."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(f"draining since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
    os.replace(temporary, path)  # readers see no file or a whole one


def clear_drain_file(path: Path | None = None) -> None:
    """Remove the drain file (the configured one when not given); absent is fine."""
    path = path or drain_file()
    if path is not None:
        path.unlink(missing_ok=True)
