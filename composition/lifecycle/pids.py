"""Whether a process still runs, and this project's worker processes on this host.

A worker process registers its pid (with its start time, so a reused pid is not taken for it)
in a directory named by the project's identity: the settings module and where it lives. Two
checkouts, or a project and its test settings, on one host never count each other's workers,
whatever their processes are called.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["pid_runs", "project_identity", "register_worker", "registered_at", "registered_workers",
           "unregister_worker", "workers_directory"]


def pid_runs(pid: int) -> bool:
    """True while a process ``pid`` exists here (a zombie, not yet reaped, still counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def project_identity() -> str:
    """A short name of this Django project: its settings module and that module's file."""
    # The variable, not settings.SETTINGS_MODULE: under override_settings that reads None.
    module_name = os.environ.get("DJANGO_SETTINGS_MODULE", "")
    module = sys.modules.get(module_name)
    where = getattr(module, "__file__", None) or os.getcwd()
    return hashlib.blake2b(f"{module_name}:{Path(where).resolve()}".encode(), digest_size=8).hexdigest()


def workers_directory() -> Path:
    """Where this project's worker processes on this host register (a temporary directory:
    a container's own, and gone with a reboot, as the processes are)."""
    return Path(tempfile.gettempdir()) / f"composition-{project_identity()}" / "workers"


def _started_at(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat, field 22), which
    tells a process from a later one given the same pid; None where it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: count from its end.
    return stat[stat.rindex(")") + 2:].split()[19]


# A dead process's registration is kept this long (it says the process is gone), then dropped
# by the next worker that registers.
FORGET_DEAD_AFTER_S = 3600.0


def register_worker(pid: int | None = None) -> None:
    """Count ``pid`` (this process by default) among this host's workers of this project. Safe
    to repeat (a heartbeat does, should a temporary-file cleaner have removed it). Raises
    ``OSError`` when the directory cannot be written."""
    pid = pid or os.getpid()
    directory = workers_directory()
    entry = directory / str(pid)
    started = _started_at(pid) or ""
    with contextlib.suppress(OSError):
        if entry.read_text() == started:  # registered already (not an earlier process's pid)
            return
    directory.mkdir(parents=True, exist_ok=True)
    entry.write_text(started)
    for dead, runs in registered_workers().items():
        with contextlib.suppress(OSError):
            entry = directory / str(dead)
            if not runs and time.time() - entry.stat().st_mtime > FORGET_DEAD_AFTER_S:
                entry.unlink()


def unregister_worker(pid: int | None = None) -> None:
    with contextlib.suppress(FileNotFoundError):
        (workers_directory() / str(pid or os.getpid())).unlink()


def registered_at(pid: int) -> float | None:
    """When ``pid`` registered (seconds since the epoch; a repeated registration keeps the first
    time), or None when it is not registered."""
    try:
        return (workers_directory() / str(pid)).stat().st_mtime
    except OSError:
        return None


def registered_workers() -> dict[int, bool]:
    """This project's registered worker pids on this host, each with whether it still runs.

    A registration outlives a killed process (that is how it is known to be gone); one whose
    pid now belongs to another process counts as not running."""
    found: dict[int, bool] = {}
    directory = workers_directory()
    for entry in directory.iterdir() if directory.is_dir() else []:
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            registered = entry.read_text()
        except OSError:  # withdrawn meanwhile
            continue
        found[pid] = pid_runs(pid) and (not registered or _started_at(pid) == registered)
    return found
