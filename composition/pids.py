"""Whether a process still runs, by pid, in this pid namespace."""

from __future__ import annotations

import os

__all__ = ["pid_runs"]


def pid_runs(pid: int) -> bool:
    """True while a process ``pid`` exists here (a zombie, not yet reaped, still counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True
