"""gunicorn server hooks for ``PROMETHEUS_MULTIPROC_DIR`` (``composition.prometheus``): import
them into your gunicorn config file (``from composition.gunicorn import child_exit, on_starting``)
so that ``/metrics`` keeps the totals of workers gunicorn has replaced and reads no more files
than there are living workers.

- ``on_starting``: the files left by processes of an earlier run go into the archive, once;
- ``child_exit``: a reaped worker's counters and histograms go into the archive (totals never go
  down) and its live gauges go, as ``prometheus_client``'s ``mark_process_dead`` does.

Neither stops the server when it fails: the files are then merged at the next start.

``gunicorn_logging(fmt, level)`` is a ``logconfig_dict`` for the same file: gunicorn's own lines (its
arbiter, a worker timing out, a request it refuses) rendered as the application's, one JSON
object per line, instead of gunicorn's plain text among them.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["child_exit", "gunicorn_logging", "on_starting"]


def gunicorn_logging(fmt: str = "json", level: str = "INFO") -> dict[str, Any]:
    """``composition.logging.logging_config`` with gunicorn's loggers sent through it (their own
    handlers, which gunicorn sets up first, are removed by configuring them)."""
    from composition.logging import logging_config

    config = logging_config(fmt, level)
    config["loggers"] |= {name: {"handlers": [], "propagate": True, "level": level}
                          for name in ("gunicorn.error", "gunicorn.access")}
    return config


def on_starting(server: Any) -> None:
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        from composition.prometheus import archive_dead_processes

        os.makedirs(directory, exist_ok=True)
        try:
            archive_dead_processes(directory)
        except Exception as exc:  # serving goes on; the leftovers still count, only unmerged
            server.log.error("could not archive leftover metrics files: %s", exc)


def child_exit(server: Any, worker: Any) -> None:
    from composition.prometheus.archive import archive_reaped_child

    try:
        archive_reaped_child(worker.pid)
    except Exception as exc:  # the arbiter goes on; the files are archived at the next start
        server.log.error("could not archive the metrics of worker %s: %s", worker.pid, exc)
