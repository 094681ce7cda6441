"""The watchdog of one data directory's embedded servers: ``python -m project.watchdog DATA_DIR LOCK_FD``.

It stops PostgreSQL and Valkey once no process that claimed them is alive, however those
processes ended: a second Ctrl-C on ``./run`` (``os._exit``, no atexit), SIGKILL, mypy's
django plugin importing the settings and exiting without cleanup. pg_ctl daemonizes the
postmaster, so no die-with-parent signal can reach it; this process is what stops it.

The first owner starts it (``project.owners.Owners.claim``) in its own session, so a
terminal's Ctrl-C does not end it. There is exactly one per data directory: it holds an flock
on ``watchdog.lock`` (inherited as ``LOCK_FD``) for its whole life. It never outlives the
owners: once none is alive it stops what runs, releases the lock and exits.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from project.embedded import EXIT_STOP_TIMEOUT_S, EmbeddedPostgres, EmbeddedValkey
from project.owners import Owners

__all__ = ["POLL_INTERVAL_S", "watch"]

log = logging.getLogger("project.watchdog")

POLL_INTERVAL_S = 0.5


def watch(data_dir: Path, lock_fd: int, poll_interval_s: float = POLL_INTERVAL_S) -> None:
    """Every ``poll_interval_s``, stop each server that has no live owner; return (having closed
    ``lock_fd``) once no server has one."""
    owners = Owners(data_dir)
    servers = [EmbeddedPostgres(data_dir), EmbeddedValkey(data_dir)]
    while True:
        with owners.locked():
            watched = False
            for server in servers:
                if owners.alive(server.name):
                    watched = True
                    continue
                try:
                    if server.halt(EXIT_STOP_TIMEOUT_S):  # returns at once when none runs
                        log.info("stopped %s: no owner is alive", server.name)
                except Exception:
                    # Never a reason to stay: the watchdog must not outlive the owners.
                    log.exception("could not stop %s", server.name)
            if not watched:
                # Released before the owners lock: the next owner must find no watchdog and
                # start one, rather than count on this one that is leaving.
                os.close(lock_fd)
                log.info("no owner is alive; exiting")
                return
        time.sleep(poll_interval_s)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s watchdog[{os.getpid()}] %(message)s")
    data_dir, lock_fd = Path(argv[0]), int(argv[1])
    log.info("watching the embedded servers of %s", data_dir)
    watch(data_dir, lock_fd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
