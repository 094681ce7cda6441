"""Real worker processes for tests, and what a child ``manage.py`` needs to see the test database."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from composition.broker import configured as broker_module
from composition.conf import conf
from composition.lifecycle.processes import detach_and_die_with_parent

__all__ = ["WorkerDidNotStop", "WorkerProcess", "current_database_url", "subprocess_env", "use_broker"]


@contextmanager
def use_broker(url: str) -> Iterator[Any]:
    """Make a broker for ``url`` this process's configured broker for the block, then put the
    original (with its declared actors) back. The temporary broker has no actors of its own."""
    import dramatiq

    original = broker_module.configured_broker()
    temporary = broker_module.build_broker(
        url, heartbeat_timeout_s=float(conf.BROKER_HEARTBEAT_TIMEOUT_S),
        maintenance_chance=int(conf.BROKER_MAINTENANCE_CHANCE),
        socket_timeout_s=float(conf.BROKER_SOCKET_TIMEOUT_S), connect_timeout_s=float(conf.BROKER_CONNECT_TIMEOUT_S),
        max_priority=conf.RABBITMQ_MAX_PRIORITY, queue_type=conf.RABBITMQ_QUEUE_TYPE,
        delivery_limit=int(conf.RABBITMQ_DELIVERY_LIMIT))
    broker_module._installed = temporary
    dramatiq.set_broker(temporary)
    try:
        yield temporary
    finally:
        broker_module._installed = original
        dramatiq.set_broker(original)
        temporary.close()


def current_database_url(alias: str = "default", *, name: str | None = None) -> str:
    """A postgresql:// URL for the database Django is using now (the test database in tests), or
    for the database ``name`` on the same server as that one."""
    from urllib.parse import quote

    from django.db import connections

    params = connections[alias].settings_dict
    host = params.get("HOST") or ""
    auth = quote(params.get("USER") or "")
    if params.get("PASSWORD"):
        auth += ":" + quote(params["PASSWORD"])
    name = quote(name or params["NAME"])
    if host.startswith("/"):
        return f"postgresql://{auth}@/{name}?host={quote(host)}"
    port = f":{params['PORT']}" if params.get("PORT") else ""
    return f"postgresql://{auth}@{host}{port}/{name}"


def subprocess_env(**overrides: str) -> dict[str, str]:
    """The environment for a child ``manage.py`` that must see the test database: this process's
    environment with the database Django uses now (the test database in tests) as ``DATABASE_URL``
    and as libpq's ``PGDATABASE``, ``PGHOST``, ``PGPORT``, ``PGUSER`` and ``PGPASSWORD``, the
    names settings read it from (docs/install.md's read the latter)."""
    from django.db import connections

    env = dict(os.environ)
    env["DATABASE_URL"] = current_database_url()
    params = connections["default"].settings_dict
    for variable, key in (("PGDATABASE", "NAME"), ("PGHOST", "HOST"), ("PGPORT", "PORT"), ("PGUSER", "USER"),
                          ("PGPASSWORD", "PASSWORD")):
        # An empty one Django leaves out of the connection, so libpq reads the variable: the
        # child inherits the one this process connected through.
        if value := str(params.get(key) or ""):
            env[variable] = value
    env.setdefault("DJANGO_SETTINGS_MODULE", os.environ.get("DJANGO_SETTINGS_MODULE", "project.settings"))
    env.update(overrides)
    return env


class WorkerDidNotStop(AssertionError):
    """A worker process that was sent SIGTERM did not exit in time (it was killed)."""


class WorkerProcess:
    """``manage.py runworkers`` as a real child process in its own process group, ended with
    the process that started it: a test run killed mid-test leaves no worker taking its queues."""

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
                                        stderr=subprocess.STDOUT,
                                        preexec_fn=functools.partial(detach_and_die_with_parent, os.getpid()))
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
        """SIGKILL the whole process group and every process it started: the crash no handler can
        see. Under ``--processes N`` the worker processes have sessions of their own (a terminal's
        Ctrl-C reaches only the supervisor), so the group alone missed them, and its supervisor's
        death only sent them SIGTERM: they drained for up to their shutdown timeout, beside
        whatever was started next."""
        children = self._children()
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for child in children:
            with suppress(ProcessLookupError):
                os.killpg(child, signal.SIGKILL)  # a child's own session: its group is its pid
        if self.process is not None:
            self.process.wait()
        deadline = time.monotonic() + 10
        while any(_alive(child) for child in children) and time.monotonic() < deadline:
            time.sleep(0.02)

    def _children(self) -> list[int]:
        """The pids of the processes this one started (their parent pid in /proc: no dependency)."""
        children = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone meanwhile
            if int(fields[1]) == self.pid:
                children.append(int(entry.name))
        return children

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, wait for the drain, return the exit code (SIGKILL after ``timeout_s``)."""
        assert self.process is not None
        if self.process.poll() is None:
            self.signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired as exc:
            self.kill_group()
            # What the process was doing is the only clue to why it did not drain.
            raise WorkerDidNotStop(f"runworkers (pid {self.pid}) did not exit within {timeout_s} s of SIGTERM; "
                                   f"killed. Its log ends:\n{self.output()[-4000:]}") from exc

    def close(self) -> None:
        """Kill what is left and delete the log (read ``output()`` before, as a failing test does)."""
        if self.process is not None and self.process.poll() is None:
            self.kill_group()
        if hasattr(self, "_log"):
            self._log.close()
        self.log_path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie reaped by its parent, or gone, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
