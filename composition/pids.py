"""Whether a process still runs, by pid or by an argument of its command line, in this pid namespace."""

from __future__ import annotations

import os

__all__ = ["pid_runs", "processes_running"]


def pid_runs(pid: int) -> bool:
    """True while a process ``pid`` exists here (a zombie, not yet reaped, still counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def processes_running(argument: str) -> list[int]:
    """The pids of this host's processes (this one excepted) with ``argument`` among their
    command-line arguments, read from /proc; empty where there is none."""
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                arguments = cmdline.read().split(b"\0")
        except OSError:  # ended meanwhile, or not ours to read
            continue
        if argument.encode() in arguments:
            found.append(int(entry))
    return found
