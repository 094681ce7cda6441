"""``composition.workers``: the worker system under its first import path.

It lives in ``composition.lifecycle.workers``.
"""

from composition.lifecycle.workers import (
    BACKGROUND_DB_THREADS,
    WorkerOptions,
    build_supervisor,
    build_worker_system,
    child_argv,
    worker_components,
)

__all__ = [
    "BACKGROUND_DB_THREADS",
    "WorkerOptions",
    "build_supervisor",
    "build_worker_system",
    "child_argv",
    "worker_components",
]
