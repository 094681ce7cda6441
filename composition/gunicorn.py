"""gunicorn server hooks, logger and worker class, to import into your gunicorn config file.

``on_starting`` and ``child_exit`` archive the metric files of earlier and reaped workers
(``composition.prometheus``), so ``/metrics`` keeps their totals and reads only living workers'
files; neither stops the server when it fails. ``gunicorn_logger(fmt)`` renders gunicorn's own
lines as the application's logs. ``ThreadWorker`` is gunicorn's gthread worker, but closes its
listening socket as soon as it stops accepting, so a graceful stop refuses new connections at once
instead of leaving them to hang in a backlog nobody accepts.
"""

from __future__ import annotations

import os
import socket
import struct
from typing import Any

from gunicorn.workers import gthread

__all__ = ["ThreadWorker", "child_exit", "gunicorn_logger", "on_starting"]


def gunicorn_logger(fmt: str = "json") -> type:
    """A gunicorn ``logger_class`` whose handlers render as ``composition.logging`` does."""
    from gunicorn.glogging import Logger

    from composition.logging import logging_config

    formatter = logging_config(fmt)["formatters"]["structlog"]

    class StructuredLogger(Logger):
        def setup(self, cfg: Any) -> None:
            super().setup(cfg)
            rendered = formatter["()"](processors=formatter["processors"],
                                       foreign_pre_chain=formatter["foreign_pre_chain"])
            for log in (self.error_log, self.access_log):
                for handler in log.handlers:
                    handler.setFormatter(rendered)

    return StructuredLogger


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


class ThreadWorker(gthread.ThreadWorker):
    """gunicorn's gthread worker, its listening sockets closed when it stops accepting for good
    (see the module doc). A worker replaced while the server runs closes only its own copies:
    the arbiter and the other workers keep theirs.

    A connection holds a thread only while it makes progress. gunicorn 27 has no header or read
    timeout for HTTP/1 (its ``timeout`` is the worker's heartbeat): a new connection waits up to
    5 s in a thread for its first byte, then headers and body are read with blocking calls and no
    limit, so a few clients that stall hold every thread. Here a thread waits
    ``first_byte_wait_s`` for the first byte (then the connection goes back to gunicorn's
    poller, which closes it after ``keepalive`` seconds without one), and a read or a write that
    makes no progress for ``stall_timeout_s`` fails, which closes the connection and frees the
    thread. That bound is per call, so a client trickling a byte every few seconds still holds
    a thread: deploy behind a buffering proxy (docker/nginx.conf), which hands gunicorn whole
    requests only.

    The limits are kernel socket options (``SO_RCVTIMEO``/``SO_SNDTIMEO``), not
    ``socket.settimeout``: gunicorn switches the socket between blocking and non-blocking as it
    moves between thread and poller, which resets a Python-level timeout but not these. They do
    not bound ``sendfile()`` (Python then waits in a selector with no timeout): the example sets
    gunicorn's ``sendfile = False``. gunicorn logs a request stalled in its headers as a socket
    error; a body read by Django fails with ``UnreadablePostError``.
    """

    first_byte_wait_s: float = 0.1
    stall_timeout_s: float = 5.0

    def set_accept_enabled(self, enabled: bool) -> None:
        super().set_accept_enabled(enabled)
        if not enabled and not self.alive:
            for sock in self.sockets:
                sock.close()  # gunicorn's close() is idempotent: its own at exit does nothing more

    def init_process(self) -> None:
        # gunicorn's own first-byte wait (5 s) is this module constant, read at each call, with
        # no setting for it; this process runs only this worker class. tests/scenarios/test_front_door.py
        # fails when a release renames it.
        gthread.DEFAULT_WORKER_DATA_TIMEOUT = self.first_byte_wait_s
        super().init_process()

    def handle(self, conn: Any) -> Any:
        if not conn.initialized:  # a new connection: bound its stalls before gunicorn reads it
            _limit_stalls(conn.sock, self.stall_timeout_s)
        return super().handle(conn)


def _limit_stalls(sock: socket.socket, timeout_s: float) -> None:
    """Make a blocking read or write on ``sock`` fail (EAGAIN) after ``timeout_s`` without progress."""
    seconds = int(timeout_s)
    timeval = struct.pack("@ll", seconds, int((timeout_s - seconds) * 1_000_000))
    for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
        sock.setsockopt(socket.SOL_SOCKET, option, timeval)
