"""``python tests/refusing_threads.py ARGS``: ``manage.py ARGS`` in a process whose kernel refuses
the thread named ``REFUSED_THREAD``, as a container at its pid limit refuses one: when that thread
is started, the process's address space is limited to what it has mapped, so the kernel cannot
give the thread a stack and Python raises its own ``RuntimeError("can't start new thread")``.
With ``REFUSE_LATER_THREADS=1`` every thread started after it is refused too (what a stop or a
rollback meets on such a host); the limit is lifted between two starts, so the rest of the
process (its connections, its allocations) goes on as it would."""

from __future__ import annotations

import os
import re
import resource
import runpy
import sys
import threading
from pathlib import Path

REFUSED = os.environ["REFUSED_THREAD"]
REFUSE_LATER = os.environ.get("REFUSE_LATER_THREADS") == "1"
_start = threading.Thread.start


def _mapped_bytes() -> int:
    status = Path("/proc/self/status").read_text()
    match = re.search(r"VmSize:\s+(\d+) kB", status)
    assert match is not None
    return int(match.group(1)) * 1024


_refusing = False


def _start_or_refuse(thread: threading.Thread) -> None:
    global _refusing
    if thread.name == REFUSED:
        _refusing = True
    if not _refusing:
        _start(thread)
        return
    # A stack larger than any thread's so far: glibc cannot hand it one it kept from a thread
    # that ended, and must map a new one, which the limit refuses.
    threading.stack_size(64 * 2**20)
    # Room for what the process's other threads allocate meanwhile, not for a 64 MiB stack.
    resource.setrlimit(resource.RLIMIT_AS, (_mapped_bytes() + 16 * 2**20, resource.RLIM_INFINITY))
    try:
        _start(thread)
    finally:
        _refusing = REFUSE_LATER
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        threading.stack_size(0)


threading.Thread.start = _start_or_refuse  # type: ignore[method-assign]
root = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(root))
sys.argv = [str(root / "manage.py"), *sys.argv[1:]]
runpy.run_path(str(root / "manage.py"), run_name="__main__")
