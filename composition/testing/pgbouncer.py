"""A throwaway PgBouncer in front of a PostgreSQL, for the tests behind a transaction pooler."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from composition.testing.servers import become, server_user
from composition.testing.waiting import free_port

__all__ = ["ThrowawayPgBouncer", "throwaway_pgbouncer"]


class ThrowawayPgBouncer:
    """A private PgBouncer (Debian's ``pgbouncer``) on a free loopback port, in front of the
    PostgreSQL at ``host``:``port``, in ``pool_mode`` with ``pool_size`` server connections per
    database and user; trust authentication for ``user``; ``settings`` adds or overrides keys of
    its ``[pgbouncer]`` section (``server_login_retry=1``). Its ini, user list, log and pid file are
    in a temporary directory; it runs as an unprivileged user (PgBouncer refuses root).
    ``url(database)`` is a client URL through it; ``log()`` its log."""

    def __init__(self, host: str = "127.0.0.1", port: int = 5432, *, user: str = "postgres",
                 pool_mode: str = "transaction", pool_size: int = 2, **settings: Any) -> None:
        binary = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None)
        if binary is None:
            raise RuntimeError("ThrowawayPgBouncer needs Debian's pgbouncer: make pgbouncer")
        self.binary = binary
        self.user = user
        self.pool_size = pool_size
        self.port = free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="throwaway-pgbouncer-"))
        (self._dir / "users.txt").write_text(f'"{user}" ""\n')
        extra = "".join(f"{key} = {value}\n" for key, value in settings.items())
        (self._dir / "pgbouncer.ini").write_text(f"""[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self._dir / "users.txt"}
pool_mode = {pool_mode}
default_pool_size = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
server_reset_query =
logfile = {self._dir / "pgbouncer.log"}
pidfile = {self._dir / "pgbouncer.pid"}
admin_users = {user}
{extra}""")
        self._user = server_user()
        if self._user is not None:
            for path in (self._dir, *self._dir.iterdir()):
                os.chown(path, self._user.pw_uid, self._user.pw_gid)
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, database: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def log(self) -> str:
        path = self._dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout_s: float = 10.0) -> ThrowawayPgBouncer:
        self.process = subprocess.Popen([self.binary, str(self._dir / "pgbouncer.ini")], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, preexec_fn=become(self._user), cwd=self._dir)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited:\n{self.log()[-2000:]}")
            # Listening is ready (its console may be closed to our user: admin_users).
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


@contextmanager
def throwaway_pgbouncer(host: str = "127.0.0.1", port: int = 5432, **options: Any) -> Iterator[ThrowawayPgBouncer]:
    bouncer = ThrowawayPgBouncer(host, port, **options).start()
    try:
        yield bouncer
    finally:
        bouncer.close()
