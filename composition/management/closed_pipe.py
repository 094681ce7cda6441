"""An operations command whose reader went away (``deadletters list | head``) stops quietly,
as ``ls`` does, rather than ending in a ``BrokenPipeError`` traceback."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["reader_may_leave"]


@contextmanager
def reader_may_leave() -> Iterator[None]:
    """Exit with status 1 (Python's own on EPIPE) and nothing on stderr when stdout is a pipe
    whose reader closed it."""
    try:
        yield
        sys.stdout.flush()  # here, not at exit: a short output is still in the buffer
    except BrokenPipeError:
        # Python flushes stdout again at exit, which would raise once more: point it at
        # /dev/null first (the recipe of Python's signal module documentation).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(1) from None
