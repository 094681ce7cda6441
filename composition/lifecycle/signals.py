"""The stop signals of a ``System`` run: SIGTERM, SIGINT and SIGHUP, installed and put back, and
what one does after the first, which asked for the stop: SIGTERM or SIGHUP again is that same
request; a second SIGINT (Ctrl-C again) exits at once.

What a changer must keep: Python runs a handler on the main thread between two of its bytecodes,
wherever that thread is (inside ``Event.wait``, holding the event's lock; inside a log call,
holding a metric's lock), so a handler takes no lock: it sets plain attributes, writes to stderr
with ``os.write`` and unlinks the ready file; the main thread polls and does the rest. Taking one
deadlocked a process for good.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterable
from types import FrameType

from composition.lifecycle.base import Component
from composition.lifecycle.ready_file import ReadyFile

__all__ = ["FORCED_EXIT_CODE", "Handlers", "another_signal", "install_stop_signals", "restore_signals"]

# Exit code of a second, forcing signal: the conventional 128 + SIGINT.
FORCED_EXIT_CODE = 130

Handlers = dict[int, signal.Handlers | Callable[..., object] | int | None]


def install_stop_signals(handler: Callable[[int, FrameType | None], None]) -> Handlers:
    """``handler`` for SIGTERM, SIGINT and SIGHUP; returns the handlers it replaced."""
    previous: Handlers = {}
    # SIGHUP too: a closed terminal or a dropped ssh session sends it, and its default (exit
    # at once) abandoned the jobs under way without a word.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        previous[signum] = signal.getsignal(signum)
        if signum == signal.SIGHUP and previous[signum] == signal.SIG_IGN:
            continue  # under nohup: it asked for the process to outlive the terminal
        signal.signal(signum, handler)
    return previous


def restore_signals(previous: Handlers) -> None:
    """Put back the handlers ``install_stop_signals`` replaced."""
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def another_signal(signum: int, components: Iterable[Component | None], ready: ReadyFile | None) -> None:
    """A signal after the first, from its handler: SIGTERM or SIGHUP is said and changes nothing;
    SIGINT removes ``ready``, kills ``components`` (their ``kill_now``) and exits the process
    with ``FORCED_EXIT_CODE``."""
    if signum in (signal.SIGTERM, signal.SIGHUP):
        # A supervisor's, not an operator insisting: systemd's KillMode=control-group
        # signals every process of the service, and a runworkers child under ./run gets
        # it again from its supervisor once the web's draining window ends, seconds later.
        # Taken as "exit at once", it dropped the jobs it was finishing.
        _say(f"{signal.Signals(signum).name} again: the same stop request, still draining "
             "(a second Ctrl-C or SIGINT exits at once)")
        return
    # The operator pressed Ctrl-C again: do not wait for anything any more, nor leave
    # child processes behind to drain on their own (they wrote on to the terminal).
    _say("second signal: exiting at once")
    # Here, not on the main thread: it may not have seen the first signal yet, and after
    # os._exit nothing runs (the file was left holding a dead pid).
    if ready is not None:
        ready.remove()
    for component in components:
        kill_now = getattr(component, "kill_now", None)
        if kill_now is not None:
            with contextlib.suppress(Exception):
                kill_now()
    os._exit(FORCED_EXIT_CODE)


def _say(line: str) -> None:
    """A line to stderr from a signal handler. A terminal that hung up (the SIGHUP's own) fails
    the write with EIO: raised in the handler, that would end the drain it is part of."""
    with contextlib.suppress(OSError):
        os.write(2, f"{line}\n".encode())
